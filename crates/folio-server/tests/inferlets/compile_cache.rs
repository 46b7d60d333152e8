//! Cranelift's incremental cache across uploads (`folio-inferlet/src/compiled.rs`):
//! every Python program embeds the same CPython (every JavaScript one the same
//! engine), which the first upload of the process compiles and the next ones take as
//! compiled.

use crate::{guest, js_guest, serial, server, shared_server};
use folio_inferlet::{FunctionCache, Host, Limits};
use std::time::Instant;

/// After the shared server's uploads, a new host of the process compiles a program
/// it never saw taking nearly every function from the process's cache. (Tests run one
/// at a time, so the cache's counts are this test's alone.)
#[test]
fn a_programs_runtime_compiled_for_another_upload_is_not_compiled_again() {
    let _s = serial();
    shared_server();
    let host = Host::new(server::engine(server::small_engine()), Limits::default()).unwrap();
    // `Host::new` compiles through the process's one cache.
    let cache = host.function_cache();
    assert!(std::ptr::eq(cache, &*FunctionCache::shared()));
    // Compiles `bytes`: (seconds, functions found compiled, functions compiled).
    let compile = |bytes: &[u8]| {
        let (h, m) = cache.hits_misses();
        let t = Instant::now();
        host.compile(bytes).expect("the guest compiles");
        let secs = t.elapsed().as_secs_f64();
        let (h2, m2) = cache.hits_misses();
        (secs, h2 - h, m2 - m)
    };
    let mut guests = vec![("Python", guest("agent"))];
    match js_guest("agent") {
        Some(js) => guests.push(("JavaScript", js)),
        None => println!("JavaScript: skipped, its guests could not be built here"),
    }
    for (language, bytes) in guests {
        let (secs, found, compiled) = compile(&bytes);
        println!(
            "{language}: {secs:.2} s, {found} functions found compiled, {compiled} compiled; \
             cache {} MiB",
            cache.bytes() >> 20
        );
        // Cranelift leaves a few hundred functions out of its cache.
        assert!(
            compiled * 10 < found + compiled,
            "{language}: under 10% of the functions compiled: {found} found, {compiled} compiled"
        );
    }
}
