//! Prompt datasets: ShareGPT (vLLM's sampling and filtering rules), random prompts with an exact
//! token count, and random prompts behind a shared prefix. Every dataset is deterministic for a
//! seed and measured with the tokenizer the run uses.

pub mod random;
pub mod sharegpt;

use thiserror::Error;

use crate::tokenizer::TokenizerError;

/// One prompt to send.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SampleRequest {
    pub prompt: String,
    /// Prompt length in tokens as the dataset measured it.
    pub prompt_len: u64,
    /// `max_tokens` for this request.
    pub expected_output_len: u64,
}

#[derive(Debug, Error)]
pub enum DatasetError {
    #[error("cannot read dataset {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is truncated: it ends inside record {records_read_plus_one} at byte offset {offset} \
         ({records_read} complete records were read before the cut); pass --allow-truncated to use them"
    )]
    Truncated {
        path: String,
        offset: u64,
        records_read: usize,
        records_read_plus_one: usize,
    },
    #[error("{path} is not a ShareGPT JSON array: {detail} (at byte offset {offset})")]
    Malformed {
        path: String,
        offset: u64,
        detail: String,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}
