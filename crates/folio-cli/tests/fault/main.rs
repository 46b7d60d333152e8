//! Faults, as a user's machine meets them, against the built `folio serve` process:
//! SIGKILL in the middle of saving a snapshot or of the disk tier's write-behind, a disk that fills while saving, a
//! `--kv-memory` larger than the machine, a save that runs past `--request-timeout`,
//! and a soak of random requests, hang-ups, forks and truncates that must end with
//! every page free or cached, the page store's invariants holding, and the server's
//! memory flat.
//!
//! The soak runs 200 requests here; `FOLIO_SOAK_REQUESTS=2000 scripts/soak.sh` runs
//! the long form and prints its figures.

#[allow(dead_code)]
#[path = "../../../folio-server/tests/http/client.rs"]
mod client;
mod kv_disk;
mod memory;
#[path = "../common/server.rs"]
mod server;
mod snapshots;
mod soak;
mod start;
mod timeout;
