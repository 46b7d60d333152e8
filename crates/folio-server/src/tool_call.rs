//! The words both tool-call readers share: how the model is to call tools
//! ([`Mode`], from `tool_choice`) and a call found in its output ([`Call`]).
//! `tools.rs` plans a request's tools and reads a whole output; `tool_stream.rs`
//! reads one as it streams; both import these, neither imports the other's caller.

/// How the model is to call tools.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Must call this function: the output is its arguments.
    Named(String),
    /// Must call one of the tools (several with `parallel`).
    Required { parallel: bool },
    /// May call them, in its own syntax.
    Auto,
}

/// One call found in an output.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as a JSON string (OpenAI's shape).
    pub arguments: String,
}
