//! The `folio` binary as a user runs it: real model, real processes, real pipes.

#[allow(dead_code)]
#[path = "common/server.rs"]
mod server;

use server::model;
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn folio(args: &[&str], stdin: Option<&str>) -> Output {
    folio_with(args, stdin, &[])
}

/// `folio` with extra environment variables.
fn folio_with(args: &[&str], stdin: Option<&str>, envs: &[(&str, &str)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_folio"))
        .args(args)
        .env("FOLIO_MODEL", model())
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn folio");
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn greedy_generate_json_matches_llama_cpp() {
    // llama.cpp's greedy continuation of this prompt starts with these ids
    // (crates/folio/tests/fixtures/llama_cpp.json, case "short", from its AVX2 build).
    // folio's AVX2 kernels keep that build's summation order, so with llama.cpp's
    // arithmetic (`--llama-arithmetic`: no second pass over the outlier blocks) they give
    // its ids. By default, and on the AVX-512 path, folio is held to the exact model
    // instead (folio's tests/it/fidelity_f64.rs).
    let v = json(&folio_with(
        &[
            "generate",
            "The capital of France is",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "--json",
            "--llama-arithmetic",
        ],
        None,
        &[("FOLIO_ISA", "avx2")],
    ));
    assert_eq!(
        v["prompt_ids"],
        serde_json::json!([504, 3575, 282, 4649, 314])
    );
    assert_eq!(
        v["generated_ids"],
        serde_json::json!([7042, 30, 198, 198, 504, 1797, 1918, 553])
    );
    assert!(v["text"].as_str().unwrap().starts_with(" Paris."));
    assert_eq!(v["finish_reason"], "length");
    for k in [
        "ttft_ms",
        "prefill_tok_s",
        "decode_tok_s",
        "prefix_hit_tokens",
        "prompt_tokens",
    ] {
        assert!(v["stats"][k].is_number(), "stats.{k}");
    }
}

/// `--spec auto` (the default) drafts and `--spec off` does not; the tokens are the same.
#[test]
fn spec_flag_changes_speed_figures_not_tokens() {
    let prompt = "one two three four five six seven, one two three four five six seven, one two";
    let run = |spec: &str| {
        json(&folio(
            &[
                "generate",
                prompt,
                "--temperature",
                "0",
                "--max-tokens",
                "40",
                "--json",
                "--spec",
                spec,
            ],
            None,
        ))
    };
    let (auto, off) = (run("auto"), run("off"));
    assert_eq!(auto["generated_ids"], off["generated_ids"]);
    assert_eq!(off["stats"]["drafted_tokens"], 0);
    assert!(
        auto["stats"]["accepted_tokens"].as_u64().unwrap() > 0,
        "{}",
        auto["stats"]
    );
}

#[test]
fn stop_strings_end_generation_and_are_not_printed() {
    let v = json(&folio(
        &[
            "generate",
            "The capital of France is",
            "--temperature",
            "0",
            "--max-tokens",
            "20",
            "--stop",
            ".",
            "--json",
        ],
        None,
    ));
    assert_eq!(v["text"], " Paris");
    assert_eq!(v["finish_reason"], "stop");
    // Streaming text mode prints the same text.
    let out = folio(
        &[
            "generate",
            "The capital of France is",
            "--temperature",
            "0",
            "--max-tokens",
            "20",
            "--stop",
            ".",
        ],
        None,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), " Paris\n");
}

#[test]
fn prompt_from_stdin_chat_mode_and_stats() {
    let out = folio(
        &[
            "generate",
            "--chat",
            "--temperature",
            "0",
            "--max-tokens",
            "12",
            "--stats",
        ],
        Some("What is 2 + 2?"),
    );
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TTFT") && err.contains("decode"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
}

#[test]
fn seeded_sampling_is_reproducible() {
    let run = |seed: &str| {
        json(&folio(
            &[
                "generate",
                "Once upon a time",
                "--temperature",
                "0.9",
                "--seed",
                seed,
                "--max-tokens",
                "16",
                "--json",
            ],
            None,
        ))["generated_ids"]
            .clone()
    };
    assert_eq!(run("7"), run("7"));
}

#[test]
fn the_second_chat_turn_prefills_only_its_new_tokens() {
    let out = folio(
        &[
            "chat",
            "--temperature",
            "0",
            "--max-tokens",
            "16",
            "--stats",
        ],
        Some("Hi, who are you?\nWhat can you do?\n"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let stats: Vec<&str> = err.lines().filter(|l| l.contains("TTFT")).collect();
    assert_eq!(stats.len(), 2, "{err}");
    let cached = |line: &str| -> usize {
        let at = line.find(" from cache").unwrap();
        line[..at].rsplit('(').next().unwrap().parse().unwrap()
    };
    assert_eq!(cached(stats[0]), 0);
    assert!(
        cached(stats[1]) > 20,
        "second turn reused {} tokens: {}",
        cached(stats[1]),
        stats[1]
    );
}

#[test]
fn bad_input_gives_a_clear_error_and_no_panic() {
    let out = folio(
        &["generate", "hi", "--model", "/nonexistent/model.gguf"],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: ") && err.contains("/nonexistent/model.gguf"),
        "{err}"
    );
    assert!(!err.contains("panicked"));

    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\0\0\0\xff\xff").unwrap();
    let out = folio(&["generate", "hi", "--model", junk.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("truncated"));

    // A prompt longer than the context.
    let long = "word ".repeat(300);
    let out = folio(&["generate", &long, "--ctx", "64"], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the context window holds 64"), "{err}");

    // An absurd thread count is refused before any thread starts (it used to abort).
    let out = folio(&["generate", "hi", "--threads", "100000000"], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("above the limit of 1024"), "{err}");
    assert!(!err.contains("panicked"));
}

#[test]
fn a_closed_pipe_stops_generation_at_once() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_folio"))
        .args([
            "generate",
            "Count:",
            "--max-tokens",
            "2000",
            "--temperature",
            "0",
            "--ignore-eos",
        ])
        .env("FOLIO_MODEL", model())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let t = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    // 2000 tokens take many seconds; the first failed write cancels the request.
    assert!(t.elapsed().as_secs() < 20, "took {:?}", t.elapsed());
    assert_eq!(out.status.code(), Some(141), "a broken pipe's exit status");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn every_size_flag_is_checked_with_the_flag_named() {
    for (args, want) in [
        (&["--ctx", "0"][..], "--ctx is 0"),
        (&["--kv-memory", "64G"], "--kv-pages (or --kv-memory)"),
        (&["--kv-pages", "1000000000"], "GiB available"),
        (
            &["--kv-pages", "4294967295"],
            "--kv-pages (or --kv-memory): is 4294967295",
        ),
        (&["--page-size", "4294967296"], "--page-size: is 4294967296"),
        (&["--page-size", "18446744073709551615"], "--page-size"),
        (&["--kv-pages", "0"], "the KV pool has no pages"),
    ] {
        let mut a = vec!["generate", "Hi", "--max-tokens", "2"];
        a.extend_from_slice(args);
        let out = folio(&a, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A huge --ctx is capped at the model's context, not allocated.
    let out = folio(
        &[
            "generate",
            "Hi",
            "--max-tokens",
            "2",
            "--ctx",
            "18446744073709551615",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = folio(&["bench", "--reps", "0", "--no-llama"], None);
    assert_eq!(out.status.code(), Some(2), "clap refuses --reps 0");
}

#[test]
fn json_is_printed_even_when_the_request_fails() {
    let out = folio(
        &[
            "generate",
            "Hi",
            "--kv-pages",
            "1",
            "--max-tokens",
            "40",
            "--json",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(v["error"]
        .as_str()
        .unwrap()
        .contains("the whole pool has 1"));
    assert_eq!(v["generated_ids"], serde_json::json!([]));
    // A snapshot problem is found before the generation, not after it.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = folio(
        &[
            "generate",
            "Hi",
            "--snapshot-dir",
            file.to_str().unwrap(),
            "--max-tokens",
            "2",
        ],
        None,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a directory"), "{err}");
    let d = dir.path().to_str().unwrap();
    let out = folio(
        &[
            "generate",
            "Hi",
            "--snapshot-dir",
            d,
            "--save-snapshot",
            "../x",
            "--max-tokens",
            "2",
        ],
        None,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("snapshot name \"../x\""), "{err}");
    assert!(out.stdout.is_empty(), "nothing was generated");
}

#[test]
fn chat_parses_slash_commands_and_ctrl_c_stops_only_the_answer() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_folio"))
        .args([
            "chat",
            "--temperature",
            "0",
            "--max-tokens",
            "400",
            "--ignore-eos",
        ])
        .env("FOLIO_MODEL", model())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(b"/save\n/nope\nWrite a very long story about the sea.\n")
        .unwrap();
    input.flush().unwrap();
    // Let the answer start, then Ctrl-C: the answer stops, the session goes on.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    input.write_all(b"/exit\n").unwrap();
    drop(input);
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut stdout, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("/save needs a name"), "{err}");
    assert!(err.contains("unknown command /nope"), "{err}");
    assert!(err.contains("(stopped; the conversation goes on)"), "{err}");
}

#[test]
fn paged_and_basic_caches_give_the_same_greedy_text_at_every_page_size() {
    let prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle.";
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            prompt,
            "--chat",
            "--temperature",
            "0",
            "--max-tokens",
            "40",
            "--json",
        ];
        args.extend_from_slice(extra);
        json(&folio(&args, None))["generated_ids"].clone()
    };
    let basic = run(&["--kv", "basic"]);
    for ps in ["1", "16", "64"] {
        assert_eq!(
            run(&["--kv", "paged", "--page-size", ps]),
            basic,
            "page size {ps}"
        );
    }
    // A pool too small for the prompt is a clear error.
    let out = folio(
        &["generate", prompt, "--kv-pages", "1", "--page-size", "4"],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("KV pages (prompt plus max_tokens); the whole pool has 1"),
        "{err}"
    );
}

#[test]
fn a_saved_snapshot_outlives_the_process_and_its_pages_serve_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let base = "The lighthouse keeper wrote in his log every night, describing the sea, the ships and the weather in careful detail.";
    let first = folio(
        &[
            "generate",
            base,
            "--temperature",
            "0",
            "--max-tokens",
            "4",
            "--json",
            "--snapshot-dir",
            d,
            "--save-snapshot",
            "keeper",
        ],
        None,
    );
    let v = json(&first);
    assert_eq!(v["stats"]["prefix_hit_tokens"], 0);
    // A new process: the snapshot is restored and the shared prompt prefix is not recomputed.
    let q = format!("{base} One night he wrote");
    let second = folio(
        &[
            "generate",
            &q,
            "--temperature",
            "0",
            "--max-tokens",
            "4",
            "--json",
            "--snapshot-dir",
            d,
        ],
        None,
    );
    let v = json(&second);
    let hits = v["stats"]["prefix_hit_tokens"].as_u64().unwrap();
    assert!(hits >= 16, "prefix hits: {hits}");
    // A corrupt file is reported and skipped, not loaded.
    std::fs::write(dir.path().join("bad.snap"), b"FOLIOSNP garbage").unwrap();
    let third = folio(
        &[
            "generate",
            &q,
            "--temperature",
            "0",
            "--max-tokens",
            "2",
            "--json",
            "--snapshot-dir",
            d,
        ],
        None,
    );
    assert!(third.status.success());
    assert!(String::from_utf8_lossy(&third.stderr).contains("snapshot skipped"));
    assert_eq!(
        json(&third)["stats"]["prefix_hit_tokens"].as_u64().unwrap(),
        hits
    );
    // Snapshots need the paged cache.
    let basic = folio(
        &["generate", "hi", "--kv", "basic", "--snapshot-dir", d],
        None,
    );
    assert!(!basic.status.success());
}

#[test]
fn nonsense_parameters_and_full_disks_are_errors_said_once() {
    for (flag, value) in [
        ("--temperature", "-1"),
        ("--temperature", "nan"),
        ("--top-p", "2"),
        ("--top-p", "nan"),
        ("--min-p", "nan"),
        ("--repeat-penalty", "0"),
        ("--repeat-penalty", "nan"),
    ] {
        let name = flag.trim_start_matches("--").replace('-', "_");
        let arg = format!("{flag}={value}");
        let out = folio(&["generate", "Hi", "--max-tokens", "2", &arg], None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}: {err}");
        assert!(
            err.contains(&format!("{name}: is ")),
            "{flag} {value}: {err}"
        );
    }
    // A full disk is reported at the first write, not after the whole generation.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_folio"))
        .args(["generate", "Count:", "--max-tokens", "2000", "--ignore-eos"])
        .env("FOLIO_MODEL", model())
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    // The OS's reason appears once, not repeated by the error chain.
    let out = folio(&["generate", "hi", "--model", "/nonexistent/m.gguf"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[test]
fn a_full_context_says_so_and_points_to_reset() {
    let out = folio(
        &[
            "generate",
            "Count:",
            "--ctx",
            "16",
            "--max-tokens",
            "100",
            "--ignore-eos",
        ],
        None,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("the context window of 16 tokens is full"),
        "{err}"
    );
    let long = "word ".repeat(80);
    let out = folio(
        &["chat", "--ctx", "64", "--max-tokens", "4"],
        Some(&format!("{long}\n{long}\n/exit\n")),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        err.matches("/reset starts a new conversation").count(),
        2,
        "{err}"
    );
}

/// examples/inferlets/generate.py built into a component (scripts/test.sh builds
/// it; built here when missing or older than its sources: the first build installs
/// componentize-py into target/inferlet-venv).
fn generate_guest() -> std::path::PathBuf {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = root.join("examples/inferlets/generate.py");
    let out = root.join("target/inferlets/generate.wasm");
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let sources = [
        src.clone(),
        root.join("crates/folio-inferlet/sdk/python/folio.py"),
        root.join("crates/folio-inferlet/sdk/python/main_wrapper.py"),
        root.join("crates/folio-inferlet/wit/folio.wit"),
    ];
    let newest = sources.iter().filter_map(|p| modified(p)).max();
    let stale = match (modified(&out), newest) {
        (None, _) => true,
        (Some(built), Some(n)) => n > built,
        (Some(_), None) => false,
    };
    if stale {
        let st = Command::new("bash")
            .arg(root.join("scripts/build_inferlet.sh"))
            .arg(&src)
            .arg(&out)
            .status()
            .expect("run scripts/build_inferlet.sh");
        assert!(st.success(), "building the generate guest failed");
    }
    out
}

#[test]
fn run_prints_what_an_inferlet_emits_and_matches_generate() {
    let prog = generate_guest();
    let prog = prog.to_str().unwrap();
    let input = r#"{"prompt": "The capital of France is", "max_tokens": 8}"#;
    let out = folio(&["run", prog, "--input", input], None);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The streamed text, then the JSON the program returns, one object a line.
    let (text, last) = stdout.trim_end().rsplit_once('\n').unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(v["tokens"], 8);
    assert_eq!(v["finish"], "length");
    let g = json(&folio(
        &[
            "generate",
            "The capital of France is",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "--json",
        ],
        None,
    ));
    assert_eq!(text, g["text"].as_str().unwrap(), "the same greedy text");
    // Input that is not JSON, and a file that is no component: errors, exit 1.
    let bad = folio(&["run", prog, "--input", "{not json"], None);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--input is not JSON"));
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"\0asm\x01\0\0\0").unwrap();
    let bad = folio(&["run", junk.to_str().unwrap()], None);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("not a valid inferlet component"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// `--device`: `auto` stays on the CPU where the only Vulkan adapter is a software one
/// (lavapipe, as in CI) or there is none, saying why at `FOLIO_LOG=info`; `gpu` runs on
/// lavapipe, and its greedy answer is the CPU's on this prompt, over f16 and over 8-bit
/// K/V (`--kv-dtype q8_0`); `--gpu-split wide` gives the same text with and without
/// `--gpu-no-subgroups` and `--gpu-no-fusion`; and a K/V pool larger than lavapipe
/// binds is refused at start.
/// Without any adapter, `gpu` is an error naming the flag (and the rest is skipped).
#[test]
fn the_device_flag_picks_the_backend_or_says_why_not() {
    let run_with_flags = |device: &str, kv: &str, extra: &[&str]| {
        let mut args = vec![
            "generate",
            "The capital of France is",
            "--temperature",
            "0",
            "--max-tokens",
            "4",
            "--json",
            "--kv-dtype",
            kv,
            "--device",
            device,
        ];
        args.extend(extra);
        folio_with(&args, None, &[("FOLIO_LOG", "info")])
    };
    let run_with = |device: &str, kv: &str| run_with_flags(device, kv, &[]);
    let run = |device: &str| run_with(device, "f16");
    let cpu = json(&run("cpu"));
    let auto = run("auto");
    let log = String::from_utf8_lossy(&auto.stderr).to_string();
    if !log.contains("runs on the GPU") {
        assert!(log.contains("the forward pass runs on the CPU"), "{log}");
        assert_eq!(json(&auto)["text"], cpu["text"]);
    }
    let gpu = run("gpu");
    let log = String::from_utf8_lossy(&gpu.stderr).to_string();
    if !gpu.status.success() {
        assert!(log.contains("--device gpu: no GPU adapter found"), "{log}");
        eprintln!("skipped the GPU run: no Vulkan adapter");
        return;
    }
    assert!(log.contains("the forward pass runs on the GPU"), "{log}");
    assert_eq!(json(&gpu)["text"], cpu["text"], "{log}");
    // Profiled too (`--gpu-profile`): the same text, and the profile on stderr.
    let cpu = run_with("cpu", "q8_0");
    let gpu = run_with_flags("gpu", "q8_0", &["--gpu-profile"]);
    let log = String::from_utf8_lossy(&gpu.stderr).to_string();
    assert!(log.contains("the forward pass runs on the GPU"), "{log}");
    assert_eq!(json(&gpu)["text"], json(&cpu)["text"], "{log}");
    assert!(
        log.contains("gpu profile, steps of 1 row: ")
            && log.contains("| attention_q8 ")
            && log.contains("| matmul ffn_down q4_1 "),
        "{log}"
    );
    // `--gpu-split wide`, its lanes' sums added within subgroups (where the adapter
    // has them: lavapipe does) and in workgroup memory (`--gpu-no-subgroups`), Q, K
    // and V in one dispatch and (`--gpu-no-fusion`) in one each: the same bits, so the
    // same text; the log names the split, the dispatches and the sums.
    let wide = |extra: &[&str]| {
        let flags = [&["--gpu-split", "wide"], extra].concat();
        let out = run_with_flags("gpu", "f16", &flags);
        let log = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(log.contains("matmuls wide"), "{log}");
        (json(&out)["text"].clone(), log)
    };
    let (in_subgroups, log) = wide(&[]);
    let (in_memory, memory_log) = wide(&["--gpu-no-subgroups", "--gpu-no-fusion"]);
    assert!(
        memory_log.contains("one matrix a dispatch, lane sums in workgroup memory"),
        "{memory_log}"
    );
    eprintln!(
        "--gpu-split wide: {}",
        if log.contains("lane sums in subgroups") {
            "subgroups"
        } else {
            "no subgroups here"
        }
    );
    assert_eq!(in_subgroups, in_memory, "{log}");
    // A pool larger than the device binds (lavapipe binds 128 MiB: 8 GiB of K/V over
    // 30 layers is 143 MB a layer) is refused when the engine starts, by `generate`
    // and by `serve` alike, never a 500 for every request.
    if !log.contains("llvmpipe") {
        return;
    }
    for command in ["generate", "serve"] {
        let mut args = vec![command, "--device", "gpu", "--kv-memory", "8GiB"];
        if command == "generate" {
            args.push("Hello");
        } else {
            args.extend(["--port", "0"]);
        }
        let out = folio_with(&args, None, &[]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{command}: {err}");
        assert!(
            err.contains("more than the device binds") && err.contains("at most 21845 pages fit"),
            "{command}: {err}"
        );
        assert!(!err.contains("forward step failed"), "{command}: {err}");
    }
}
