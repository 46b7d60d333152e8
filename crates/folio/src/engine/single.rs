//! One sequence's step without an engine: reserve its slots, run the model, commit,
//! the same three moves the engine's loop makes for a whole batch. For tests, benches
//! and scoring (teacher forcing) on the contiguous oracle or one paged sequence.

use super::error::EngineError;
use crate::kv::{KvSeq, Logits};
use crate::model::Model;

/// Runs `tokens` at the positions following what `seq` holds, stores their K/V and
/// returns the logits (`vocab` per requested position). On error nothing is stored.
pub fn forward_one<S: KvSeq + ?Sized>(
    model: &Model,
    seq: &mut S,
    tokens: &[u32],
    logits: Logits,
) -> Result<Vec<f32>, EngineError> {
    let batch = seq.reserve(tokens, logits)?;
    match model.forward(&batch, seq.storage()) {
        Ok(mut out) => {
            seq.commit()?;
            Ok(out.pop().unwrap_or_default())
        }
        Err(e) => {
            seq.abort(tokens.len());
            Err(e.into())
        }
    }
}
