//! The server over real HTTP on loopback, with the real model: a raw client
//! (std's TcpStream, so tests control every byte, and can hang up mid-answer)
//! against the server started in-process on a free port.

mod cancel;
mod client;
mod contexts;
mod embeddings;
mod errors;
mod grammar_limits;
mod hostile;
mod kv_events;
mod limits;
mod load;
mod messages;
mod openai_fields;
mod preempt;
mod replica;
mod responses;
mod routes;
mod server;
mod shared_snapshots;
mod snapshots_hostile;
mod spec;
mod stall;
mod tool_calls;
