//! KV events over ZMQ (`folio serve --kv-events ENDPOINT`): the prefix index's
//! changes, published in the format vLLM's publisher uses, so that a precise
//! prefix-aware router (llm-d's KV-cache indexer, or any subscriber written for
//! vLLM) can index this replica's pages.
//!
//! # Wire format
//!
//! Every message has three frames: the topic (UTF-8), the sequence number (8 bytes,
//! big-endian, from 0, one per message), and a msgpack payload. The payload is an
//! event batch encoded as msgspec encodes vLLM's `array_like` structs: an array
//! `[ts, events, data_parallel_rank]` (seconds since the epoch as a float64, the
//! events, rank 0). Each event is an array whose first item is its tag (msgspec's
//! tagged union in array form), with the fields of vLLM's newest events:
//!
//! - `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//!   lora_id, medium, lora_name, extra_keys, group_idx]`: full pages entered the
//!   index, each continuing the one before it; `parent_block_hash` is the page the
//!   first continues (nil for the first page of a prompt); `token_ids` are all their
//!   tokens (`block_size` per page); `lora_id` and `lora_name` nil; `medium` `"GPU"`
//!   (the engine's own pool, vLLM's `MEDIUM_GPU`); `extra_keys` one entry per page,
//!   `[cache_salt]` for a tenant's first page and nil for every other, as vLLM
//!   hashes them; `group_idx` 0 (one KV-cache group).
//! - `["BlockRemoved", block_hashes, medium, group_idx]`: pages left the index.
//! - `["AllBlocksCleared"]`: forget every page of this replica. Sent first, when the
//!   publisher starts, and again whenever events were lost (the engine never waits
//!   for the publisher: a batch that does not fit its queue is dropped); a router
//!   then knows a subset of the pages held, never a page that is gone.
//!
//! Older decoders read this too: msgspec ignores trailing array items a struct does
//! not declare, and llm-d's decoder reads the fields by position with length guards
//! (docs/kv-events.md).
//!
//! # Replay
//!
//! With `--kv-events-replay ENDPOINT` a ROUTER socket is bound there, as vLLM's
//! `replay_endpoint`: a client (a DEALER; a REQ socket would take only the first
//! answer) sends `["", seq]` (an empty delimiter, then the first sequence number it
//! wants as 8 bytes big-endian) and gets `["", seq, payload]` for every buffered
//! message from `seq` on (the last [`REPLAY_KEPT`] messages are kept), then
//! `["", -1 as 8 bytes, ""]`.
//!
//! # Block keys
//!
//! - `vllm` (the default): vLLM's `sha256_cbor` keys. A page's key is the SHA-256 of
//!   the canonical CBOR of `(parent, tokens, extra)`: the parent's 32-byte key
//!   (`NONE_HASH` for a first page, the SHA-256 of the CBOR text of the seed,
//!   `--kv-events-seed`, as vLLM derives it from `PYTHONHASHSEED`), the page's token
//!   ids as an array, and `extra`: null, or for a tenant's first page
//!   (`cache_salt`) the one-string array `[salt]`, as vLLM's
//!   `generate_block_hash_extra_keys` puts the salt into the extra keys of the block
//!   at token 0 only. On the wire a key is its last 8 bytes as a big-endian unsigned
//!   integer (vLLM's default, `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`). A subscriber
//!   that knows the seed and the block size reproduces every key from the token ids
//!   and, for a tenant, the salt (in `extra_keys`).
//! - `folio`: folio's own 128-bit chained page hashes, as 16-byte big-endian
//!   binaries (llm-d reads their last 8 bytes): no hashing beyond what the pool
//!   already does, and the keys are the pool's, but only folio computes them.

use folio::{KvEvent, KvEventBatch, KvEventReceiver, KvParent};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// How block keys are computed (`--kv-events-hash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvHashMode {
    /// vLLM's `sha256_cbor` keys, as 64-bit integers.
    Vllm,
    /// folio's 128-bit page hashes, as 16-byte binaries.
    Folio,
}

impl std::str::FromStr for KvHashMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "vllm" => Ok(Self::Vllm),
            "folio" => Ok(Self::Folio),
            _ => Err(format!("{s:?}: expected vllm or folio")),
        }
    }
}

/// The publisher's settings.
#[derive(Debug, Clone)]
pub struct KvEventsConfig {
    /// `tcp://HOST:PORT`. As vLLM decides: a host of `*` (or `::`) binds, any other
    /// connects (to a subscriber that binds, as llm-d's does).
    pub endpoint: String,
    /// The first frame of every message (llm-d reads `kv@<replica>@<model>`).
    pub topic: String,
    pub hash: KvHashMode,
    /// vLLM's `PYTHONHASHSEED`: the root of the `vllm` keys.
    pub seed: String,
    /// Tokens per page (vLLM's block size).
    pub block_size: usize,
    /// Where the replay socket (ROUTER) binds (`--kv-events-replay`); none: no replay.
    pub replay: Option<String>,
}

/// Messages the replay socket can hand out again (vLLM's `buffer_steps` default).
pub const REPLAY_KEPT: usize = 10_000;

/// The end of a replay: -1 as a signed 8-byte big-endian integer.
const REPLAY_END: [u8; 8] = [0xff; 8];

/// The last messages published, `(sequence number, payload)`, oldest first.
type ReplayRing = Arc<Mutex<VecDeque<(u64, bytes::Bytes)>>>;

/// Why the publisher could not start.
#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    #[error("--kv-events {0:?}: expected tcp://HOST:PORT (HOST * binds, another connects)")]
    Endpoint(String),
    #[error(
        "--kv-events-replay {0:?}: expected tcp://HOST:PORT (bound; HOST * for every interface)"
    )]
    ReplayEndpoint(String),
    #[error("{endpoint}: cannot bind: {source}")]
    Bind {
        endpoint: String,
        source: zeromq::ZmqError,
    },
    #[error("KV events: cannot start the publisher's runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Bound to listen (`tcp://*:PORT`), or to connect to a subscriber.
fn parse_endpoint(e: &str) -> Result<(bool, String), KvEventsError> {
    let bad = || KvEventsError::Endpoint(e.to_string());
    let rest = e.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    match host {
        "" => Err(bad()),
        "*" => Ok((true, format!("tcp://0.0.0.0:{port}"))),
        "[::]" | "::" | "[*]" => Ok((true, format!("tcp://[::]:{port}"))),
        _ => Ok((false, e.to_string())),
    }
}

/// Starts the publisher on a thread of its own (with a one-worker runtime for the
/// socket): it takes the engine's batches from `rx` until the engine stops. A bind
/// fails here; a connection is retried until it succeeds. Callable from inside or
/// outside an async runtime (it only waits for the thread's bind).
pub fn spawn(
    cfg: KvEventsConfig,
    rx: KvEventReceiver,
) -> Result<std::thread::JoinHandle<()>, KvEventsError> {
    let (bind, endpoint) = parse_endpoint(&cfg.endpoint)?;
    // The replay socket always binds: where HOST names an interface, on it.
    let replay = match &cfg.replay {
        None => None,
        Some(r) => Some(
            parse_endpoint(r)
                .map_err(|_| KvEventsError::ReplayEndpoint(r.clone()))?
                .1,
        ),
    };
    let (started_tx, started) = std::sync::mpsc::channel::<Result<(), KvEventsError>>();
    let thread = std::thread::Builder::new()
        .name("folio-kv-events".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("folio-kv-events-io")
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = started_tx.send(Err(e.into()));
                    return;
                }
            };
            let mut socket = rt.block_on(async { zeromq::PubSocket::new() });
            if bind {
                if let Err(source) = rt.block_on(socket.bind(&endpoint)) {
                    let _ = started_tx.send(Err(KvEventsError::Bind {
                        endpoint: format!("--kv-events {}", cfg.endpoint),
                        source,
                    }));
                    return;
                }
                tracing::info!("KV events: publishing on {}", cfg.endpoint);
            }
            let ring: ReplayRing = Arc::default();
            if let Some(at) = &replay {
                let mut router = rt.block_on(async { zeromq::RouterSocket::new() });
                if let Err(source) = rt.block_on(router.bind(at)) {
                    let _ = started_tx.send(Err(KvEventsError::Bind {
                        endpoint: format!("--kv-events-replay {at}"),
                        source,
                    }));
                    return;
                }
                tracing::info!("KV events: replay on {at}");
                rt.spawn(serve_replay(router, ring.clone()));
            }
            let _ = started_tx.send(Ok(()));
            if !bind {
                let mut warned = false;
                while let Err(e) = rt.block_on(socket.connect(&endpoint)) {
                    if !warned {
                        tracing::warn!("KV events: cannot connect to {endpoint} ({e}); retrying");
                        warned = true;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                tracing::info!("KV events: publishing to {endpoint}");
                // The subscriber's subscription arrives just after the connection; a
                // message before it would be dropped (ZMQ's slow joiner).
                std::thread::sleep(Duration::from_millis(500));
            }
            let mut publisher = Publisher::new(&cfg);
            loop {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(Some(batch)) => {
                        let frames = publisher.message(&batch);
                        if replay.is_some() {
                            let mut r = ring.lock().unwrap_or_else(|p| p.into_inner());
                            r.push_back((publisher.seq - 1, frames[2].clone()));
                            while r.len() > REPLAY_KEPT {
                                r.pop_front();
                            }
                        }
                        let msg = match ZmqMessage::try_from(frames) {
                            Ok(m) => m,
                            Err(_) => continue,
                        };
                        if let Err(e) = rt.block_on(socket.send(msg)) {
                            tracing::warn!("KV events: send failed: {e}");
                        }
                    }
                    Ok(None) => {}
                    Err(()) => break,
                }
            }
            if rx.dropped() > 0 {
                tracing::info!(
                    "KV events: {} batches were dropped while the publisher lagged",
                    rx.dropped()
                );
            }
        })?;
    match started.recv() {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(KvEventsError::Runtime(std::io::Error::other(
            "the publisher's thread stopped",
        ))),
    }
}

/// Answers replay requests until the socket fails: `[identity, "", seq]` in, every
/// buffered message from `seq` on out as `[identity, "", seq, payload]`, then
/// `[identity, "", -1, ""]` (vLLM's framing). A malformed request is logged and
/// ignored.
async fn serve_replay(mut router: zeromq::RouterSocket, ring: ReplayRing) {
    loop {
        let req = match router.recv().await {
            Ok(m) => m.into_vec(),
            Err(e) => {
                tracing::warn!("KV events: the replay socket stopped: {e}");
                return;
            }
        };
        let from = match req.as_slice() {
            [id, delim, seq] if delim.is_empty() && seq.len() == 8 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(seq);
                (id.clone(), u64::from_be_bytes(b))
            }
            _ => {
                tracing::warn!(
                    "KV events: a replay request of {} frames, not [identity, \"\", 8-byte sequence number]: ignored",
                    req.len()
                );
                continue;
            }
        };
        let (id, start) = from;
        let found: Vec<(u64, bytes::Bytes)> = {
            let r = ring.lock().unwrap_or_else(|p| p.into_inner());
            r.iter().filter(|(s, _)| *s >= start).cloned().collect()
        };
        let mut replies = found
            .into_iter()
            .map(|(seq, payload)| {
                vec![
                    id.clone(),
                    bytes::Bytes::new(),
                    bytes::Bytes::copy_from_slice(&seq.to_be_bytes()),
                    payload,
                ]
            })
            .collect::<Vec<_>>();
        replies.push(vec![
            id.clone(),
            bytes::Bytes::new(),
            bytes::Bytes::copy_from_slice(&REPLAY_END),
            bytes::Bytes::new(),
        ]);
        for frames in replies {
            let Ok(msg) = ZmqMessage::try_from(frames) else {
                continue;
            };
            if let Err(e) = router.send(msg).await {
                // The client went away: the rest of its answer has nowhere to go.
                tracing::debug!("KV events: replay answer not sent: {e}");
                break;
            }
        }
    }
}

/// Turns the engine's batches into messages: keys, coalescing, encoding, sequence.
pub struct Publisher {
    topic: Vec<u8>,
    seq: u64,
    block_size: usize,
    keys: Keys,
}

impl Publisher {
    pub fn new(cfg: &KvEventsConfig) -> Self {
        Self {
            topic: cfg.topic.as_bytes().to_vec(),
            seq: 0,
            block_size: cfg.block_size,
            keys: match cfg.hash {
                KvHashMode::Vllm => Keys::Vllm(VllmKeys::new(&cfg.seed)),
                KvHashMode::Folio => Keys::Folio,
            },
        }
    }

    /// The three frames of `batch`'s message (the next sequence number).
    pub fn message(&mut self, batch: &KvEventBatch) -> Vec<bytes::Bytes> {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let payload = self.payload(batch, ts);
        let seq = self.seq;
        self.seq += 1;
        vec![
            bytes::Bytes::from(self.topic.clone()),
            bytes::Bytes::copy_from_slice(&seq.to_be_bytes()),
            bytes::Bytes::from(payload),
        ]
    }

    /// The msgpack payload of `batch` at time `ts`.
    pub fn payload(&mut self, batch: &KvEventBatch, ts: f64) -> Vec<u8> {
        let mut events: Vec<Vec<u8>> = Vec::new();
        if batch.cleared {
            let mut e = Vec::new();
            mp::array(&mut e, 1);
            mp::str(&mut e, "AllBlocksCleared");
            events.push(e);
        }
        let mut i = 0;
        while i < batch.events.len() {
            match &batch.events[i] {
                KvEvent::Stored {
                    hash,
                    parent,
                    tokens,
                    salt,
                } => {
                    // A run of pages each continuing the one before: one BlockStored.
                    let salt = salt.as_deref().map(String::from_utf8_lossy);
                    let (first_key, parent_key) =
                        self.keys.stored(*hash, *parent, tokens, salt.as_deref());
                    let mut keys = vec![first_key];
                    let mut all_tokens = tokens.clone();
                    let mut last = *hash;
                    i += 1;
                    while let Some(KvEvent::Stored {
                        hash,
                        parent: KvParent::Hash(p),
                        tokens,
                        salt: None,
                    }) = batch.events.get(i)
                    {
                        if *p != last {
                            break;
                        }
                        keys.push(self.keys.stored(*hash, KvParent::Hash(*p), tokens, None).0);
                        all_tokens.extend_from_slice(tokens);
                        last = *hash;
                        i += 1;
                    }
                    let mut e = Vec::new();
                    mp::array(&mut e, 10);
                    mp::str(&mut e, "BlockStored");
                    mp::array(&mut e, keys.len());
                    for k in &keys {
                        k.encode(&mut e);
                    }
                    match parent_key {
                        Some(k) => k.encode(&mut e),
                        None => mp::nil(&mut e),
                    }
                    mp::array(&mut e, all_tokens.len());
                    for &t in &all_tokens {
                        mp::uint(&mut e, t as u64);
                    }
                    mp::uint(&mut e, self.block_size as u64);
                    mp::nil(&mut e); // lora_id
                    mp::str(&mut e, MEDIUM);
                    mp::nil(&mut e); // lora_name
                                     // extra_keys: one entry per page, the salt on a tenant's first.
                    mp::array(&mut e, keys.len());
                    match &salt {
                        Some(s) => {
                            mp::array(&mut e, 1);
                            mp::str(&mut e, s);
                        }
                        None => mp::nil(&mut e),
                    }
                    for _ in 1..keys.len() {
                        mp::nil(&mut e);
                    }
                    mp::uint(&mut e, 0); // group_idx
                    events.push(e);
                }
                KvEvent::Removed { .. } => {
                    // A run of removals: one BlockRemoved.
                    let mut keys = Vec::new();
                    while let Some(KvEvent::Removed { hash }) = batch.events.get(i) {
                        keys.push(self.keys.removed(*hash));
                        i += 1;
                    }
                    let mut e = Vec::new();
                    mp::array(&mut e, 4);
                    mp::str(&mut e, "BlockRemoved");
                    mp::array(&mut e, keys.len());
                    for k in &keys {
                        k.encode(&mut e);
                    }
                    mp::str(&mut e, MEDIUM);
                    mp::uint(&mut e, 0); // group_idx
                    events.push(e);
                }
            }
        }
        let mut out = Vec::with_capacity(16 + events.iter().map(Vec::len).sum::<usize>());
        mp::array(&mut out, 3);
        mp::float(&mut out, ts);
        mp::array(&mut out, events.len());
        for e in &events {
            out.extend_from_slice(e);
        }
        mp::uint(&mut out, 0); // data_parallel_rank
        out
    }
}

/// The `medium` of every event: the engine's own pool (vLLM's `MEDIUM_GPU`; llm-d
/// reads it as its default tier, `gpu`).
const MEDIUM: &str = "GPU";

/// A block key as it goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Int(u64),
    Bin16(u128),
}

impl Key {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Key::Int(v) => mp::uint(out, *v),
            Key::Bin16(v) => mp::bin(out, &v.to_be_bytes()),
        }
    }
}

enum Keys {
    Vllm(VllmKeys),
    Folio,
}

impl Keys {
    /// A stored page's key, and its parent's (`None` for a first page).
    fn stored(
        &mut self,
        hash: u128,
        parent: KvParent,
        tokens: &[u32],
        salt: Option<&str>,
    ) -> (Key, Option<Key>) {
        match self {
            Keys::Folio => (
                Key::Bin16(hash),
                match (parent, salt) {
                    (KvParent::Hash(p), None) => Some(Key::Bin16(p)),
                    _ => None,
                },
            ),
            Keys::Vllm(v) => {
                let (digest, parent) = v.stored(hash, parent, tokens, salt);
                (
                    Key::Int(low64(&digest)),
                    parent.map(|p| Key::Int(low64(&p))),
                )
            }
        }
    }

    fn removed(&mut self, hash: u128) -> Key {
        match self {
            Keys::Folio => Key::Bin16(hash),
            Keys::Vllm(v) => Key::Int(v.removed(hash)),
        }
    }
}

/// vLLM's external form of a 32-byte key: its last 8 bytes, big-endian.
fn low64(d: &[u8; 32]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[24..]);
    u64::from_be_bytes(b)
}

/// The most keys of evicted pages remembered (for pages stored later that continue
/// them: a sliding window evicts a sequence's early pages while it still grows).
const GONE_KEPT: usize = 1 << 16;

/// folio page hashes → vLLM keys, for the pages indexed and the last evicted ones.
struct VllmKeys {
    none_hash: [u8; 32],
    /// Key, and whether the page is indexed now.
    keys: HashMap<u128, ([u8; 32], bool)>,
    gone: VecDeque<u128>,
}

impl VllmKeys {
    fn new(seed: &str) -> Self {
        let mut c = Vec::new();
        cbor::text(&mut c, seed);
        Self {
            none_hash: Sha256::digest(&c).into(),
            keys: HashMap::new(),
            gone: VecDeque::new(),
        }
    }

    /// The page's key and its parent's (`None`: a first page). `salt`: the page is
    /// the first of a tenant's chain, keyed with the salt as vLLM keys the block at
    /// token 0 of a request with that `cache_salt`.
    fn stored(
        &mut self,
        hash: u128,
        parent: KvParent,
        tokens: &[u32],
        salt: Option<&str>,
    ) -> ([u8; 32], Option<[u8; 32]>) {
        let (digest, parent_key) = match (parent, salt) {
            (_, Some(s)) => (block_key(&self.none_hash, tokens, Some(s)), None),
            (KvParent::Root, None) => (block_key(&self.none_hash, tokens, None), None),
            (KvParent::Hash(p), None) => match self.keys.get(&p) {
                Some(&(pk, _)) => (block_key(&pk, tokens, None), Some(pk)),
                // A salted chain's root whose salt the pool no longer remembers (more
                // tenants than it keeps), or a parent forgotten long ago: a first page
                // keyed apart from every other.
                None => {
                    let extra = format!("folio-chain:{p:032x}");
                    (block_key(&self.none_hash, tokens, Some(&extra)), None)
                }
            },
        };
        self.keys.insert(hash, (digest, true));
        (digest, parent_key)
    }

    fn removed(&mut self, hash: u128) -> u64 {
        let Some(entry) = self.keys.get_mut(&hash) else {
            // Never stored while we listened: its key is unknown; folio's low bits
            // name nothing a subscriber knows.
            return hash as u64;
        };
        entry.1 = false;
        let key = low64(&entry.0);
        self.gone.push_back(hash);
        while self.gone.len() > GONE_KEPT {
            if let Some(old) = self.gone.pop_front() {
                if self.keys.get(&old).is_some_and(|e| !e.1) {
                    self.keys.remove(&old);
                }
            }
        }
        key
    }
}

/// vLLM's `hash_block_tokens` with `sha256_cbor`: SHA-256 of the canonical CBOR of
/// `(parent, tokens, extra)`, `extra` null or a one-string array.
fn block_key(parent: &[u8; 32], tokens: &[u32], extra: Option<&str>) -> [u8; 32] {
    let mut c = Vec::with_capacity(40 + tokens.len() * 5);
    cbor::head(&mut c, 4, 3);
    cbor::bytes(&mut c, parent);
    cbor::head(&mut c, 4, tokens.len() as u64);
    for &t in tokens {
        cbor::head(&mut c, 0, t as u64);
    }
    match extra {
        None => c.push(0xf6),
        Some(s) => {
            cbor::head(&mut c, 4, 1);
            cbor::text(&mut c, s);
        }
    }
    Sha256::digest(&c).into()
}

/// The CBOR this needs (RFC 8949, shortest heads: canonical).
mod cbor {
    pub fn head(out: &mut Vec<u8>, major: u8, n: u64) {
        let m = major << 5;
        if n < 24 {
            out.push(m | n as u8);
        } else if n <= u8::MAX as u64 {
            out.extend_from_slice(&[m | 24, n as u8]);
        } else if n <= u16::MAX as u64 {
            out.push(m | 25);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else if n <= u32::MAX as u64 {
            out.push(m | 26);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        } else {
            out.push(m | 27);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
    pub fn bytes(out: &mut Vec<u8>, b: &[u8]) {
        head(out, 2, b.len() as u64);
        out.extend_from_slice(b);
    }
    pub fn text(out: &mut Vec<u8>, s: &str) {
        head(out, 3, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
}

/// The msgpack this needs (shortest forms, as msgspec writes them).
mod mp {
    pub fn array(out: &mut Vec<u8>, n: usize) {
        if n < 16 {
            out.push(0x90 | n as u8);
        } else if n <= u16::MAX as usize {
            out.push(0xdc);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            out.push(0xdd);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
    pub fn uint(out: &mut Vec<u8>, v: u64) {
        if v < 128 {
            out.push(v as u8);
        } else if v <= u8::MAX as u64 {
            out.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= u16::MAX as u64 {
            out.push(0xcd);
            out.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= u32::MAX as u64 {
            out.push(0xce);
            out.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
    pub fn nil(out: &mut Vec<u8>) {
        out.push(0xc0);
    }
    pub fn float(out: &mut Vec<u8>, v: f64) {
        out.push(0xcb);
        out.extend_from_slice(&v.to_be_bytes());
    }
    pub fn str(out: &mut Vec<u8>, s: &str) {
        let n = s.len();
        if n < 32 {
            out.push(0xa0 | n as u8);
        } else if n <= u8::MAX as usize {
            out.extend_from_slice(&[0xd9, n as u8]);
        } else if n <= u16::MAX as usize {
            out.push(0xda);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            out.push(0xdb);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        out.extend_from_slice(s.as_bytes());
    }
    pub fn bin(out: &mut Vec<u8>, b: &[u8]) {
        let n = b.len();
        if n <= u8::MAX as usize {
            out.extend_from_slice(&[0xc4, n as u8]);
        } else if n <= u16::MAX as usize {
            out.push(0xc5);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            out.push(0xc6);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        out.extend_from_slice(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(hash: KvHashMode) -> KvEventsConfig {
        KvEventsConfig {
            endpoint: "tcp://*:5557".into(),
            topic: "kv@a@m".into(),
            hash,
            seed: "0".into(),
            block_size: 2,
            replay: None,
        }
    }

    #[test]
    fn endpoints_bind_on_a_wildcard_and_connect_otherwise() {
        assert_eq!(
            parse_endpoint("tcp://*:5557").unwrap(),
            (true, "tcp://0.0.0.0:5557".into())
        );
        assert_eq!(
            parse_endpoint("tcp://127.0.0.1:5557").unwrap(),
            (false, "tcp://127.0.0.1:5557".into())
        );
        for bad in ["udp://x:1", "tcp://:1", "tcp://h", "tcp://h:99999"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cbor_and_sha256_match_a_known_vllm_none_hash_input() {
        // cbor2.dumps("0", canonical=True) == b"\x610"; the digest is SHA-256 of that.
        let mut c = Vec::new();
        cbor::text(&mut c, "0");
        assert_eq!(c, b"\x610");
        let mut c = Vec::new();
        cbor::head(&mut c, 4, 3);
        cbor::head(&mut c, 0, 1000);
        assert_eq!(c, [0x83, 0x19, 0x03, 0xe8]);
    }

    #[test]
    fn a_chain_of_stores_is_one_block_stored_and_removals_one_block_removed() {
        let mut p = Publisher::new(&cfg(KvHashMode::Folio));
        let batch = KvEventBatch {
            cleared: true,
            events: vec![
                KvEvent::Stored {
                    hash: 10,
                    parent: KvParent::Root,
                    tokens: vec![1, 2],
                    salt: None,
                },
                KvEvent::Stored {
                    hash: 11,
                    parent: KvParent::Hash(10),
                    tokens: vec![3, 4],
                    salt: None,
                },
                KvEvent::Removed { hash: 10 },
                KvEvent::Removed { hash: 11 },
            ],
        };
        let out = p.payload(&batch, 1.5);
        let mut want = vec![0x93, 0xcb];
        want.extend_from_slice(&1.5f64.to_be_bytes());
        want.push(0x93); // three events
        want.push(0x91);
        want.push(0xa0 | 16);
        want.extend_from_slice(b"AllBlocksCleared");
        want.push(0x9a);
        want.push(0xa0 | 11);
        want.extend_from_slice(b"BlockStored");
        want.push(0x92);
        for h in [10u128, 11] {
            want.extend_from_slice(&[0xc4, 16]);
            want.extend_from_slice(&h.to_be_bytes());
        }
        want.push(0xc0);
        want.extend_from_slice(&[0x94, 1, 2, 3, 4, 2, 0xc0, 0xa3]);
        want.extend_from_slice(b"GPU");
        // lora_name, extra_keys (nil per page), group_idx.
        want.extend_from_slice(&[0xc0, 0x92, 0xc0, 0xc0, 0]);
        want.push(0x94);
        want.push(0xa0 | 12);
        want.extend_from_slice(b"BlockRemoved");
        want.push(0x92);
        for h in [10u128, 11] {
            want.extend_from_slice(&[0xc4, 16]);
            want.extend_from_slice(&h.to_be_bytes());
        }
        want.push(0xa3);
        want.extend_from_slice(b"GPU");
        want.push(0); // group_idx
        want.push(0); // data_parallel_rank
        assert_eq!(out, want);
        for seq in 0..3u64 {
            let frames = p.message(&KvEventBatch::default());
            assert_eq!(&frames[0][..], b"kv@a@m");
            assert_eq!(&frames[1][..], &seq.to_be_bytes());
        }
    }

    #[test]
    fn vllm_keys_chain_through_parents_and_removals_name_the_stored_key() {
        let mut k = VllmKeys::new("0");
        let (a, pa) = k.stored(10, KvParent::Root, &[1, 2], None);
        assert_eq!(pa, None);
        assert_eq!(a, block_key(&k.none_hash, &[1, 2], None));
        let (b, pb) = k.stored(11, KvParent::Hash(10), &[3, 4], None);
        assert_eq!(pb, Some(a));
        assert_eq!(b, block_key(&a, &[3, 4], None));
        assert_eq!(k.removed(11), low64(&b));
        // A salted chain's first page: vLLM's key for that salt, then chained as usual.
        let (c, pc) = k.stored(12, KvParent::Hash(99), &[1, 2], Some("tenant"));
        assert_eq!(pc, None);
        assert_eq!(c, block_key(&k.none_hash, &[1, 2], Some("tenant")));
        assert_ne!(c, a);
        let (d, pd) = k.stored(13, KvParent::Hash(12), &[3, 4], None);
        assert_eq!(pd, Some(c));
        assert_eq!(d, block_key(&c, &[3, 4], None));
        // A salted root the pool forgot: still a first page, apart from the rest.
        let (e, pe) = k.stored(14, KvParent::Hash(98), &[1, 2], None);
        assert_eq!(pe, None);
        assert!(e != a && e != c);
    }

    #[test]
    fn a_salted_first_page_carries_its_salt_in_extra_keys() {
        let mut p = Publisher::new(&cfg(KvHashMode::Vllm));
        let batch = KvEventBatch {
            cleared: false,
            events: vec![
                KvEvent::Stored {
                    hash: 20,
                    parent: KvParent::Hash(7),
                    tokens: vec![1, 2],
                    salt: Some(b"t1".as_slice().into()),
                },
                KvEvent::Stored {
                    hash: 21,
                    parent: KvParent::Hash(20),
                    tokens: vec![3, 4],
                    salt: None,
                },
            ],
        };
        let out = p.payload(&batch, 0.0);
        // ... 2 (block_size), nil, "GPU", nil, [["t1"], nil], 0], 0]
        let mut tail = vec![2, 0xc0, 0xa3];
        tail.extend_from_slice(b"GPU");
        tail.extend_from_slice(&[0xc0, 0x92, 0x91, 0xa2, b't', b'1', 0xc0, 0, 0]);
        assert!(out.ends_with(&tail), "{out:02x?}");
        // One BlockStored of two keys, the first page's parent nil.
        let at = out
            .windows(11)
            .position(|w| w == b"BlockStored")
            .expect("a BlockStored");
        assert_eq!(out[at + 11], 0x92);
    }
}
