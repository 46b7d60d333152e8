//! From a wire request to what the engine runs: the prompts as token ids, one
//! [`folio::Request`] for them, and how the answer is to be shaped (stream or not,
//! echo, log-probabilities). Every check that can fail on the request alone happens
//! here, before any work, with the field named.
//!
//! # OpenAI's request fields
//!
//! No field of OpenAI's completions or chat completions request schema is dropped
//! unseen: each is implemented, accepted and ignored where ignoring it changes
//! nothing a client can observe in the answer, or refused with a 400 whose `param`
//! names it. A `null` is the field left out. Fields outside both schemas (other
//! servers' extensions folio does not know) are still ignored; the extensions it
//! knows (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `cache_salt`,
//! `guided_*`, `structured_outputs`, `json_schema`, and folio's own `speculative`:
//! `false` keeps the request out of speculative decoding) are implemented. The checks apply
//! on both routes (and a context's generation).
//!
//! | field | schema | folio |
//! |---|---|---|
//! | `model` | both | accepted; the one model is served whatever the name |
//! | `prompt` / `messages` | completions / chat | implemented |
//! | `max_tokens`, `max_completion_tokens`, `n`, `stop`, `seed`, `temperature`, `top_p` | both | implemented |
//! | `presence_penalty`, `frequency_penalty` | both | implemented |
//! | `logit_bias` | both | implemented: token id (a string) → bias in -100..=100, at most [`folio::engine::MAX_LOGIT_BIAS`] (1024) entries, ids in the vocabulary; added to the logits before every draw, greedy too, under a grammar too |
//! | `logprobs`, `top_logprobs`, `echo` | both / chat / completions | implemented |
//! | `stream`, `stream_options.include_usage` | both | implemented (`include_obfuscation` ignored: there is no obfuscation padding to turn off) |
//! | `response_format`, `tools`, `tool_choice`, `parallel_tool_calls` | chat | implemented |
//! | `continue_final_message` (vLLM's) | chat | implemented: the last message, an assistant's, is continued (its end of turn left off) |
//! | `user`, `safety_identifier` | both / chat | accepted, ignored: an end-user id for OpenAI's abuse monitoring (as llama.cpp and vLLM do) |
//! | `prompt_cache_key` | chat | accepted, ignored: a routing hint for OpenAI's cache; folio's prefix cache needs none (`cache_salt` separates tenants) |
//! | `metadata` | chat | accepted (an object), ignored: it only labels stored completions, and folio stores none (`store: true` is refused) |
//! | `prediction` | chat | implemented (both routes): `{"type": "content", "content": text or text parts}`, tokenized and drafted from by speculative decoding while the output agrees with it; the answer is the one without it, `completion_tokens_details` counts the drafted tokens accepted and rejected |
//! | `service_tier` | chat | `"auto"` and `"default"` accepted (the one tier); any other a 400 |
//! | `store` | chat | `false` accepted; `true` a 400: folio does not store chat completions |
//! | `modalities` | chat | `["text"]` accepted; anything else a 400 |
//! | `verbosity` | chat | `"medium"` (the default) accepted; any other a 400: folio has no length control of that kind |
//! | `reasoning_effort` | chat | a 400: folio does not control a model's reasoning |
//! | `audio` | chat | a 400: no audio output |
//! | `web_search_options` | chat | a 400: no web search |
//! | `functions`, `function_call` | chat (deprecated) | a 400 pointing to `tools` / `tool_choice` |
//! | `best_of` | completions | accepted when equal to `n` (or absent); any other a 400 |
//! | `suffix` | completions | `""` accepted; a non-empty suffix a 400: no insertion mode |

use crate::api::{ChatMessage, Content, GenRequest, LogprobsInput, PromptInput, StopInput};
use crate::error::ApiError;
use crate::tools::{self, Tools};
use folio::grammar::{CompileCancel, GrammarError, GrammarSpec, GrammarTable};
use folio::tokenizer::{ChatTemplate, Message};
use folio::{Model, Prompt, Request, SamplingParams};

/// Which route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Completions,
    Chat,
    /// A context's generation: the prompt (text or ids, optional) is appended to what
    /// the context holds; the engine checks the window.
    Context,
}

/// A checked request, ready to run.
pub struct Job {
    /// Token ids of each prompt (a chat has one).
    pub prompts: Vec<Vec<u32>>,
    /// Each prompt as text (what `echo` sends back).
    pub prompt_texts: Vec<String>,
    /// The engine request; its prompt is set per prompt when it runs.
    pub req: Request,
    pub stream: bool,
    pub include_usage: bool,
    pub echo: bool,
    /// Alternatives per token when log-probabilities were asked for.
    pub logprobs: Option<usize>,
    /// Chat: the tools the model may or must call.
    pub tools: Option<Tools>,
}

impl Job {
    /// Choices in the answer: `n` per prompt.
    pub fn choices(&self) -> usize {
        self.prompts.len() * self.req.n
    }
}

/// The most choices (prompts × n) one request makes.
pub const MAX_CHOICES: usize = 256;
/// The most prompt tokens one request carries over all its prompts (each prompt is
/// also held to the window): one request must not queue hours of prefill.
pub const MAX_REQUEST_TOKENS: usize = 65_536;
/// Stop strings: how many, and their bytes in all.
pub const MAX_STOPS: usize = 16;
pub const MAX_STOP_BYTES: usize = 4096;
/// The longest `cache_salt`, in bytes.
pub const MAX_SALT_BYTES: usize = 1024;

/// A `cache_salt` (of a request or a context) is at most [`MAX_SALT_BYTES`].
pub fn check_salt(salt: Option<&str>) -> Result<(), ApiError> {
    if salt.is_some_and(|s| s.len() > MAX_SALT_BYTES) {
        return Err(ApiError::invalid(
            "cache_salt",
            format!("cache_salt is at most {MAX_SALT_BYTES} bytes"),
        ));
    }
    Ok(())
}
/// An echo with log-probabilities sends prompt tokens × choices × (alternatives + 1)
/// figures: at most this many.
pub const MAX_ECHO_FIGURES: usize = 1 << 20;

/// OpenAI's predicted output as tokens: `{"type": "content", "content": "..."}` or
/// content as text parts (`[{"type": "text", "text": "..."}]`).
fn prediction_of(
    p: Option<serde_json::Map<String, serde_json::Value>>,
    tok: &folio::tokenizer::Tokenizer,
) -> Result<Vec<u32>, ApiError> {
    use serde_json::Value;
    let Some(p) = p else {
        return Ok(Vec::new());
    };
    let bad = |why: &str| ApiError::invalid("prediction", why.to_string());
    if p.get("type").and_then(Value::as_str) != Some("content") {
        return Err(bad("prediction.type must be \"content\""));
    }
    let text = match p.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    _ => return Err(bad(
                        "prediction.content parts must be {\"type\": \"text\", \"text\": string}",
                    )),
                }
            }
            text
        }
        _ => {
            return Err(bad(
                "prediction.content must be a string or a list of text parts",
            ))
        }
    };
    let ids = tok
        .try_encode(&text, false)
        .map_err(folio::EngineError::from)?;
    if ids.len() > folio::engine::MAX_PREDICTION {
        return Err(bad(&format!(
            "prediction.content is {} tokens; at most {}",
            ids.len(),
            folio::engine::MAX_PREDICTION
        )));
    }
    Ok(ids)
}

/// Checks `r` for `route` and tokenizes its prompt(s); `window` is the most tokens a
/// sequence holds, `cap` the most one choice may generate (`--max-tokens-cap`).
pub fn job(
    route: Route,
    r: GenRequest,
    model: &Model,
    template: Option<&ChatTemplate>,
    grammars: GrammarTable<'_>,
    window: usize,
    cap: usize,
) -> Result<Job, ApiError> {
    let cancel = CompileCancel::default();
    job_cancellable(route, r, model, template, grammars, (window, cap), &cancel)
}

/// [`job`], where `cancel` abandons the grammar's compile when the request goes away.
pub fn job_cancellable(
    route: Route,
    mut r: GenRequest,
    model: &Model,
    template: Option<&ChatTemplate>,
    grammars: GrammarTable<'_>,
    (window, cap): (usize, usize),
    cancel: &CompileCancel,
) -> Result<Job, ApiError> {
    openai_fields(&r)?;
    let bias = logit_bias_of(r.logit_bias.take(), model.config.vocab)?;
    let tok = &model.tokenizer;
    let prediction = prediction_of(r.prediction.take(), tok)?;
    let (mut tool_plan, mut forced) = (None, None);
    let (prompts, prompt_texts) = match route {
        Route::Completions => {
            if r.messages.is_some() {
                return Err(ApiError::invalid(
                    "messages",
                    "messages belong to /v1/chat/completions; this route takes a prompt",
                ));
            }
            let Some(p) = r.prompt.take() else {
                return Err(ApiError::invalid("prompt", "prompt is required"));
            };
            completion_prompts(p, model)?
        }
        Route::Chat => {
            if r.prompt.is_some() {
                return Err(ApiError::invalid(
                    "prompt",
                    "a prompt belongs to /v1/completions; this route takes messages",
                ));
            }
            let Some(msgs) = r.messages.take() else {
                return Err(ApiError::invalid("messages", "messages is required"));
            };
            let plan = tools::plan(&mut r)?;
            let shown = plan.as_ref().map(|(t, _)| tools::template_tools(t));
            if let Some((t, g)) = plan {
                tool_plan = Some(t);
                forced = g;
            }
            let text = match r.continue_final_message.unwrap_or(false) {
                true => render_continued(&msgs, template, shown.as_ref())?,
                false => render_chat(&msgs, template, true, shown.as_ref())?,
            };
            let ids = tok
                .try_encode(&text, true)
                .map_err(folio::EngineError::from)?;
            (vec![ids], vec![text])
        }
        Route::Context => {
            if r.messages.is_some() {
                return Err(ApiError::invalid(
                    "messages",
                    "append messages with /append, then generate",
                ));
            }
            let ids = match r.prompt.take() {
                None => Vec::new(),
                Some(PromptInput::Text(t)) => tok
                    .try_encode(&t, false)
                    .map_err(folio::EngineError::from)?,
                Some(PromptInput::Tokens(ids)) => Prompt::Tokens(ids).tokens(model)?,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "prompt",
                        "a context takes one prompt: a string or token ids",
                    ))
                }
            };
            let text = tok.decode(&ids);
            (vec![ids], vec![text])
        }
    };
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    // A context's prompt goes after what it holds: the engine checks the window.
    if route != Route::Context {
        check_lengths(&prompts, longest, window)?;
    }
    let room = match route {
        Route::Context => window,
        _ => window - longest,
    };
    let mut job = request_fields(
        route,
        r,
        prompts,
        prompt_texts,
        (room, cap),
        (grammars, cancel),
        forced,
    )?;
    job.tools = tool_plan;
    job.req.sampling.logit_bias = bias;
    job.req.prediction = prediction;
    Ok(job)
}

/// No prompt empty, none reaching the window, and at most [`MAX_REQUEST_TOKENS`] in
/// all.
fn check_lengths(prompts: &[Vec<u32>], longest: usize, window: usize) -> Result<(), ApiError> {
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        let what = if prompts.len() > 1 {
            format!("prompt {i} is empty")
        } else {
            "the prompt is empty".into()
        };
        return Err(ApiError::invalid("prompt", what));
    }
    if longest >= window {
        return Err(ApiError::from(folio::EngineError::PromptTooLong {
            len: longest,
            window,
        }));
    }
    let total: usize = prompts.iter().map(Vec::len).sum();
    if total > MAX_REQUEST_TOKENS {
        return Err(ApiError::invalid(
            "prompt",
            format!("the prompts hold {total} tokens in all; one request takes at most {MAX_REQUEST_TOKENS}: send them in several requests"),
        ));
    }
    Ok(())
}

/// The sampling and answer fields of `r`; `room` is the most tokens left to generate
/// in the window, `cap` the most one choice may generate; the grammar, if any, is
/// compiled with `grammars` unless `cancel` stops it.
fn request_fields(
    route: Route,
    mut r: GenRequest,
    prompts: Vec<Vec<u32>>,
    prompt_texts: Vec<String>,
    (room, cap): (usize, usize),
    (grammars, cancel): (GrammarTable<'_>, &CompileCancel),
    forced: Option<GrammarSpec>,
) -> Result<Job, ApiError> {
    let grammar = grammar_of(&mut r, grammars, cancel, forced)?;
    let echo = r.echo.unwrap_or(false);
    if echo && route != Route::Completions {
        return Err(ApiError::invalid("echo", "echo is for /v1/completions"));
    }
    let logprobs = logprobs_of(route, &r)?;
    let max_tokens = max_tokens_of(route, &r, (room, cap), echo)?;
    let n = samples_of(&r, prompts.len())?;
    let stop = stops_of(r.stop.take())?;
    check_salt(r.cache_salt.as_deref())?;
    let r_sent_repetition = r.repetition_penalty.is_some();
    let sampling = sampling_of(&r)?;
    let mut req = Request::new(Prompt::Tokens(Vec::new()));
    req.max_tokens = max_tokens;
    req.sampling = sampling;
    req.stop = stop;
    req.ignore_eos = r.ignore_eos.unwrap_or(false);
    req.speculative = r.speculative.unwrap_or(true);
    req.logprobs = logprobs;
    req.prompt_logprobs = if echo { logprobs } else { None };
    if let Some(k) = req.prompt_logprobs {
        let tokens: usize = prompts.iter().map(Vec::len).sum();
        let figures = tokens
            .saturating_mul(usize::try_from(n).unwrap_or(usize::MAX))
            .saturating_mul(k + 1);
        if figures > MAX_ECHO_FIGURES {
            return Err(ApiError::invalid(
                "logprobs",
                format!("echo with logprobs would send {figures} figures (prompt tokens × n × (logprobs + 1)); at most {MAX_ECHO_FIGURES}: lower n or logprobs"),
            ));
        }
    }
    req.n = usize::try_from(n).unwrap_or(usize::MAX);
    req.salt = r.cache_salt.map(String::into_bytes);
    req.grammar = grammar;
    if max_tokens == 0 && req.prompt_logprobs.is_none() {
        // Echo without log-probabilities and nothing to generate: nothing to compute,
        // but the request must still be a valid one.
        req.max_tokens = 1;
        req.validate().map_err(ApiError::from)?;
        req.max_tokens = 0;
    } else {
        req.validate().map_err(|e| {
            let mut e = ApiError::from(e);
            // Name the field as the client sent it.
            if e.param.as_deref() == Some("repeat_penalty") && r_sent_repetition {
                e.param = Some("repetition_penalty".into());
            }
            e
        })?;
    }
    let include_usage = r
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    Ok(Job {
        prompts,
        prompt_texts,
        req,
        stream: r.stream.unwrap_or(false),
        include_usage,
        echo,
        logprobs,
        tools: None,
    })
}
/// The request's grammar, compiled: the one it asks for (`response_format`,
/// `guided_*`) or the one a forced tool call needs, never both.
fn grammar_of(
    r: &mut GenRequest,
    grammars: GrammarTable<'_>,
    cancel: &CompileCancel,
    forced: Option<GrammarSpec>,
) -> Result<Option<folio::grammar::Grammar>, ApiError> {
    let asked = grammar_spec(r)?;
    if let (Some(_), Some((param, _))) = (&forced, &asked) {
        return Err(ApiError::invalid(
            *param,
            "a forced tool call (tool_choice required or a named function) already constrains the output",
        ));
    }
    let asked = asked.or(forced.map(|g| ("tools", g)));
    Ok(match asked {
        None => None,
        Some((param, spec)) => {
            let gs = grammars.get().map_err(|_| {
                ApiError::invalid(
                    param,
                    "structured output is not available for this model's vocabulary",
                )
            })?;
            Some(
                gs.compile_with(&spec, cancel)
                    .map_err(|e| grammar_error(param, e))?,
            )
        }
    })
}

/// How many alternatives per token the answer carries (`None`: no log-probabilities),
/// as each route spells it.
fn logprobs_of(route: Route, r: &GenRequest) -> Result<Option<usize>, ApiError> {
    let logprobs = match (route, r.logprobs) {
        (_, None) | (Route::Chat, Some(LogprobsInput::Flag(false))) => None,
        (Route::Chat, Some(LogprobsInput::Flag(true))) => {
            Some(count(r.top_logprobs, "top_logprobs")?)
        }
        (Route::Chat, Some(LogprobsInput::Count(_))) => {
            return Err(ApiError::invalid(
                "logprobs",
                "logprobs must be a boolean here (top_logprobs says how many alternatives)",
            ))
        }
        (Route::Completions | Route::Context, Some(LogprobsInput::Count(k))) => {
            Some(count(Some(k), "logprobs")?)
        }
        (Route::Context, Some(LogprobsInput::Flag(f))) => f
            .then(|| count(r.top_logprobs, "top_logprobs"))
            .transpose()?,
        (Route::Completions, Some(LogprobsInput::Flag(_))) => {
            return Err(ApiError::invalid(
                "logprobs",
                "logprobs must be an integer here: how many alternatives per token (0-20)",
            ))
        }
    };
    if route == Route::Chat && r.top_logprobs.is_some() && logprobs.is_none() {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        ));
    }
    Ok(logprobs)
}

/// The most tokens per choice: what was asked within the window (`room`) and the
/// cap, else OpenAI's defaults.
fn max_tokens_of(
    route: Route,
    r: &GenRequest,
    (room, cap): (usize, usize),
    echo: bool,
) -> Result<usize, ApiError> {
    let asked = match route {
        Route::Chat | Route::Context => r.max_completion_tokens.or(r.max_tokens),
        Route::Completions => r.max_tokens,
    };
    if let Some(m) = asked.filter(|&m| m > cap as u64) {
        let name = match (route, r.max_completion_tokens.is_some()) {
            (Route::Chat | Route::Context, true) => "max_completion_tokens",
            _ => "max_tokens",
        };
        return Err(ApiError::invalid(
            name,
            format!("{name} is {m}; this server generates at most {cap} tokens per choice (--max-tokens-cap)"),
        ));
    }
    // OpenAI's defaults: 16 tokens for a completion, the rest of the window for a chat
    // (within the cap).
    let max_tokens = match (asked, route) {
        (Some(m), _) => usize::try_from(m).unwrap_or(usize::MAX).min(room),
        (None, Route::Completions) => 16.min(room).min(cap),
        (None, Route::Chat | Route::Context) => room.min(cap),
    };
    if max_tokens == 0 && !echo {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens must be at least 1 (0 only with echo, to score the prompt)",
        ));
    }
    Ok(max_tokens)
}

/// `n`, checked against the engine's limit and, times the prompts, the choices'.
fn samples_of(r: &GenRequest, prompts: usize) -> Result<u64, ApiError> {
    let n = r.n.unwrap_or(1);
    if n == 0 || n > folio::engine::MAX_N as u64 {
        return Err(ApiError::invalid(
            "n",
            format!("n must be between 1 and {}", folio::engine::MAX_N),
        ));
    }
    if n.saturating_mul(prompts as u64) > MAX_CHOICES as u64 {
        return Err(ApiError::invalid(
            "n",
            format!(
                "prompts × n is {prompts} × {n}; one request makes at most {MAX_CHOICES} choices"
            ),
        ));
    }
    Ok(n)
}

/// The stop strings, checked.
fn stops_of(stop: Option<StopInput>) -> Result<Vec<String>, ApiError> {
    let stop = match stop {
        None => Vec::new(),
        Some(StopInput::One(s)) => vec![s],
        Some(StopInput::Many(v)) => v,
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop string must not be empty"));
    }
    if stop.len() > MAX_STOPS || stop.iter().map(String::len).sum::<usize>() > MAX_STOP_BYTES {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} stop strings of {MAX_STOP_BYTES} bytes in all"),
        ));
    }
    Ok(stop)
}

/// OpenAI's fields folio accepts only in some values, or not at all (see the table in
/// the module doc): the first one sent that is refused, as a 400 naming it.
fn openai_fields(r: &GenRequest) -> Result<(), ApiError> {
    let refuse = |param: &str, why: &str| Err(ApiError::invalid(param, why.to_string()));
    if let Some(t) = r
        .service_tier
        .as_deref()
        .filter(|t| !matches!(*t, "auto" | "default"))
    {
        return refuse(
            "service_tier",
            &format!("service_tier {t:?}: this server has one tier (\"auto\" or \"default\")"),
        );
    }
    if r.store == Some(true) {
        return refuse(
            "store",
            "this server does not store chat completions: leave store out or false",
        );
    }
    if r.modalities.as_ref().is_some_and(|m| m != &["text"]) {
        return refuse(
            "modalities",
            "this model answers in text: modalities [\"text\"]",
        );
    }
    if r.verbosity.as_deref().is_some_and(|v| v != "medium") {
        return refuse(
            "verbosity",
            "verbosity is not supported (only its default, \"medium\")",
        );
    }
    if r.reasoning_effort.is_some() {
        return refuse(
            "reasoning_effort",
            "reasoning_effort is not supported: this server does not control a model's reasoning",
        );
    }
    if r.audio.is_some() {
        return refuse("audio", "audio output is not supported");
    }
    if r.web_search_options.is_some() {
        return refuse("web_search_options", "web search is not supported");
    }
    if r.functions.is_some() {
        return refuse(
            "functions",
            "functions is deprecated and not supported: use tools",
        );
    }
    if r.function_call.is_some() {
        return refuse(
            "function_call",
            "function_call is deprecated and not supported: use tool_choice",
        );
    }
    if let Some(b) = r.best_of.filter(|&b| b != r.n.unwrap_or(1)) {
        return refuse(
            "best_of",
            &format!("best_of {b} is not supported: only best_of equal to n (ask for n choices and rank them yourself)"),
        );
    }
    if r.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return refuse("suffix", "suffix (insertion) is not supported");
    }
    Ok(())
}

/// OpenAI's `logit_bias` (token id as a string → bias in -100..=100) as the engine's
/// pairs, ordered by id; every fault is a 400 naming `logit_bias`: a key that is not
/// a token id (a decimal integer) or is one outside the `vocab`, the same id twice, a
/// bias that is not a number in range, over [`folio::engine::MAX_LOGIT_BIAS`]
/// entries.
pub fn logit_bias_of(
    map: Option<serde_json::Map<String, serde_json::Value>>,
    vocab: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |why: String| ApiError::invalid("logit_bias", why);
    let Some(map) = map else {
        return Ok(Vec::new());
    };
    let most = folio::engine::MAX_LOGIT_BIAS;
    if map.len() > most {
        return Err(bad(format!(
            "logit_bias has {} entries; at most {most}",
            map.len()
        )));
    }
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in &map {
        let id = (!k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
            .then(|| k.parse::<u32>().ok())
            .flatten()
            .ok_or_else(|| bad(format!("logit_bias key {k:?} is not a token id")))?;
        if id as usize >= vocab {
            return Err(bad(format!(
                "token {id} is outside the vocabulary (0..{vocab})"
            )));
        }
        let b = v
            .as_f64()
            .filter(|b| b.is_finite() && b.abs() <= f64::from(folio::engine::MAX_BIAS))
            .ok_or_else(|| {
                bad(format!(
                    "token {id}'s bias is {v}; it must be a number between -100 and 100"
                ))
            })?;
        out.push((id, b as f32));
    }
    out.sort_unstable_by_key(|p| p.0);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(bad(format!("token {} is given twice", w[0].0)));
    }
    Ok(out)
}

/// The sampling fields (a seed drawn when none is given).
fn sampling_of(r: &GenRequest) -> Result<SamplingParams, ApiError> {
    let seed = match &r.seed {
        None => fresh_seed(),
        Some(num) => num
            .as_u64()
            .or_else(|| num.as_i64().map(|v| v as u64))
            .ok_or_else(|| ApiError::invalid("seed", "seed must be an integer"))?,
    };
    let top_k = r.top_k.unwrap_or(0);
    Ok(SamplingParams {
        temperature: r.temperature.unwrap_or(1.0),
        // -1 (vLLM) and 0 (llama.cpp) both mean no cut.
        top_k: usize::try_from(top_k.max(0)).unwrap_or(usize::MAX),
        top_p: r.top_p.unwrap_or(1.0),
        min_p: r.min_p.unwrap_or(0.0),
        repeat_penalty: r.repetition_penalty.or(r.repeat_penalty).unwrap_or(1.0),
        presence_penalty: r.presence_penalty.unwrap_or(0.0),
        frequency_penalty: r.frequency_penalty.unwrap_or(0.0),
        seed,
        ..SamplingParams::default()
    })
}

/// A grammar that cannot be used, as the answer: the request's fault (a 400 naming
/// `param`: malformed, over a cap, unsatisfiable) or the server's (a 500 whose text
/// says nothing of llguidance's internals; they are in the log).
fn grammar_error(param: &str, e: GrammarError) -> ApiError {
    let mut out = ApiError::from(folio::EngineError::Grammar(e));
    if out.status == axum::http::StatusCode::BAD_REQUEST {
        out.param = Some(param.to_string());
    }
    out
}

fn count(k: Option<u64>, name: &str) -> Result<usize, ApiError> {
    let k = k.unwrap_or(0);
    if k > folio::engine::MAX_LOGPROBS as u64 {
        return Err(ApiError::invalid(
            name,
            format!("{name} must be at most {}", folio::engine::MAX_LOGPROBS),
        ));
    }
    Ok(k as usize)
}

/// A seed for a request that gave none: different every time.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ NEXT.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
}

/// The prompts of a completion request as token ids, and as text.
fn completion_prompts(
    p: PromptInput,
    model: &Model,
) -> Result<(Vec<Vec<u32>>, Vec<String>), ApiError> {
    let tok = &model.tokenizer;
    let encode =
        |t: &str| -> Result<Vec<u32>, ApiError> { Ok(Prompt::Text(t.to_string()).tokens(model)?) };
    let ids_in_vocab =
        |ids: Vec<u32>| -> Result<Vec<u32>, ApiError> { Ok(Prompt::Tokens(ids).tokens(model)?) };
    let (ids, texts): (Vec<Vec<u32>>, Vec<String>) = match p {
        PromptInput::Text(t) => (vec![encode(&t)?], vec![t]),
        PromptInput::Texts(ts) => (ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?, ts),
        PromptInput::Tokens(ids) => {
            let ids = ids_in_vocab(ids)?;
            let text = tok.decode_special(&ids);
            (vec![ids], vec![text])
        }
        PromptInput::TokenLists(lists) => {
            let ids: Vec<Vec<u32>> = lists
                .into_iter()
                .map(ids_in_vocab)
                .collect::<Result<_, _>>()?;
            let texts = ids.iter().map(|i| tok.decode_special(i)).collect();
            (ids, texts)
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt list is empty"));
    }
    Ok((ids, texts))
}

/// Renders `msgs`, the last an assistant's, so that the answer continues it: the
/// template's text up to the end of that message's text, its end of turn left off
/// (as vLLM's `continue_final_message`). A 400 where the last message is not the
/// assistant's, or where the template does not show its text as written.
pub fn render_continued(
    msgs: &[ChatMessage],
    template: Option<&ChatTemplate>,
    tools: Option<&serde_json::Value>,
) -> Result<String, ApiError> {
    let param = "continue_final_message";
    let Some(last) = msgs.last().filter(|m| m.role == "assistant") else {
        return Err(ApiError::invalid(
            param,
            "continue_final_message needs the last message to be the assistant's",
        ));
    };
    let start = message_text(&last.content, msgs.len() - 1)?;
    if start.is_empty() {
        // Nothing to continue: an answer to what comes before.
        return render_chat(&msgs[..msgs.len() - 1], template, true, tools);
    }
    let text = render_chat(msgs, template, false, tools)?;
    match text.rfind(start.as_str()) {
        Some(at) => Ok(text[..at + start.len()].to_string()),
        None => Err(ApiError::invalid(
            param,
            "the chat template does not show the last message's text as written: it cannot be continued",
        )),
    }
}

/// Renders `msgs` with the model's chat template.
pub fn render_chat(
    msgs: &[ChatMessage],
    template: Option<&ChatTemplate>,
    add_generation_prompt: bool,
    tools: Option<&serde_json::Value>,
) -> Result<String, ApiError> {
    let Some(template) = template else {
        return Err(ApiError::invalid(
            "messages",
            "the model's chat template could not be compiled; use /v1/completions",
        ));
    };
    if msgs.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let content = message_text(&m.content, i)?;
        // OpenAI's newer name for the system role.
        let role = if m.role == "developer" {
            "system"
        } else {
            &m.role
        };
        let mut msg = Message::new(role, &content);
        for (k, v) in m.fields.iter().filter(|(_, v)| !v.is_null()) {
            msg = msg.with(k, v.clone());
        }
        out.push(msg);
    }
    template
        .render_with_tools(&out, add_generation_prompt, tools)
        .map_err(|e| {
            ApiError::invalid(
                "messages",
                format!("the chat template refused these messages: {e}"),
            )
        })
}

/// A message's text: a string, or its text parts joined by newlines (other parts are
/// a 400 naming the message).
pub fn message_text(c: &Option<Content>, i: usize) -> Result<String, ApiError> {
    let Some(Content::Parts(parts)) = c else {
        return Ok(match c {
            Some(Content::Text(t)) => t.clone(),
            _ => String::new(),
        });
    };
    let mut texts = Vec::new();
    for p in parts {
        match (&*p.kind, &p.text) {
            ("text", Some(t)) => texts.push(t.as_str()),
            ("text", None) => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].content"),
                    "a text part needs its text",
                ))
            }
            (kind, _) => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].content"),
                    format!(
                        "content parts of type {kind:?} are not supported: this model reads text"
                    ),
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

/// The grammar a request asks for, and the field it came in: OpenAI's
/// `response_format`, vLLM's `guided_*` and `structured_outputs`, llama.cpp's
/// `json_schema`. At most one source.
fn grammar_spec(r: &mut GenRequest) -> Result<Option<(&'static str, GrammarSpec)>, ApiError> {
    let schema = |param: &'static str, v: serde_json::Value| -> Result<GrammarSpec, ApiError> {
        match v {
            serde_json::Value::String(s) => serde_json::from_str(&s)
                .map(GrammarSpec::JsonSchema)
                .map_err(|e| ApiError::invalid(param, format!("{param} is not JSON: {e}"))),
            serde_json::Value::Object(_) | serde_json::Value::Bool(true) => {
                Ok(GrammarSpec::JsonSchema(v))
            }
            _ => Err(ApiError::invalid(
                param,
                format!("{param} must be a JSON schema (an object)"),
            )),
        }
    };
    let mut found: Vec<(&'static str, GrammarSpec)> = Vec::new();
    if let Some(f) = r.response_format.take() {
        match f.kind.as_str() {
            "text" => {}
            "json_object" => found.push(("response_format", GrammarSpec::JsonObject)),
            "json_schema" => {
                let s = f.json_schema.and_then(|j| j.schema).ok_or_else(|| {
                    ApiError::invalid("response_format", "json_schema needs json_schema.schema")
                })?;
                found.push(("response_format", schema("response_format", s)?));
            }
            other => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!("response_format type {other:?}: use text, json_object or json_schema"),
                ))
            }
        }
    }
    let so = r.structured_outputs.take();
    let (so_json, so_regex, so_choice, so_grammar) = match so {
        Some(s) => (s.json, s.regex, s.choice, s.grammar),
        None => (None, None, None, None),
    };
    for (param, v) in [
        ("guided_json", r.guided_json.take()),
        ("json_schema", r.json_schema.take()),
        ("structured_outputs", so_json),
    ] {
        if let Some(v) = v {
            found.push((param, schema(param, v)?));
        }
    }
    for (param, v) in [
        ("guided_regex", r.guided_regex.take()),
        ("structured_outputs", so_regex),
    ] {
        if let Some(v) = v {
            found.push((param, GrammarSpec::Regex(v)));
        }
    }
    for (param, v) in [
        ("guided_choice", r.guided_choice.take()),
        ("structured_outputs", so_choice),
    ] {
        if let Some(v) = v {
            found.push((param, GrammarSpec::Choice(v)));
        }
    }
    for (param, v) in [
        ("guided_grammar", r.guided_grammar.take()),
        ("structured_outputs", so_grammar),
    ] {
        if let Some(v) = v {
            found.push((param, GrammarSpec::Lark(v)));
        }
    }
    if found.len() > 1 {
        return Err(ApiError::invalid(
            found[1].0,
            "give one structured-output source (response_format, guided_json, guided_regex, guided_choice, guided_grammar, structured_outputs or json_schema)",
        ));
    }
    Ok(found.pop())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_bias_is_parsed_and_every_fault_names_the_field() {
        let map = |v: serde_json::Value| match v {
            serde_json::Value::Object(m) => Some(m),
            _ => unreachable!(),
        };
        let got = logit_bias_of(map(serde_json::json!({"7": -100, "3": 2.5, "0": 100})), 10);
        assert_eq!(got.unwrap(), vec![(0, 100.0), (3, 2.5), (7, -100.0)]);
        assert_eq!(logit_bias_of(None, 10).unwrap(), Vec::new());
        let many: serde_json::Map<_, _> = (0..=folio::engine::MAX_LOGIT_BIAS)
            .map(|i| (i.to_string(), serde_json::json!(1)))
            .collect();
        for bad in [
            map(serde_json::json!({"x": 1})),
            map(serde_json::json!({"-1": 1})),
            map(serde_json::json!({"1.5": 1})),
            map(serde_json::json!({"": 1})),
            map(serde_json::json!({"99999999999": 1})),
            map(serde_json::json!({"10": 1})),
            map(serde_json::json!({"1": 100.5})),
            map(serde_json::json!({"1": -101})),
            map(serde_json::json!({"1": "5"})),
            map(serde_json::json!({"1": null})),
            map(serde_json::json!({"1": 1, "01": 2})),
            Some(many),
        ] {
            let e = logit_bias_of(bad.clone(), 10).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("logit_bias"), "{bad:?}");
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn chat_messages_pass_tool_calls_and_tool_results_to_the_template() {
        let template = ChatTemplate::new(
            "{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}[{{ c.function.name }} {{ c.function.arguments }} {{ c.id }}]{% endfor %}{% endif %}{% if m.tool_call_id is defined %}<{{ m.tool_call_id }}>{% endif %}{% if 'refusal' in m %}!{% endif %}|{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let msgs: Vec<ChatMessage> = serde_json::from_value(serde_json::json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "refusal": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21"},
        ]))
        .unwrap();
        let text = render_chat(&msgs, Some(&template), false, None).unwrap();
        // A null field is left out, as if absent.
        assert_eq!(
            text,
            "user:Weather?|assistant:[get_weather {\"city\": \"Paris\"} call_1]|tool:21<call_1>|"
        );
    }
}
