//! ShareGPT V3 (`ShareGPT_V3_unfiltered_cleaned_split.json`), sampled as `vllm bench serve` does
//! (vllm/benchmarks/datasets/datasets.py `ShareGPTDataset`): keep records with at least two
//! turns, shuffle with the seed, take turn 0 as the prompt and turn 1 as the reference completion,
//! drop pairs with fewer than 4 prompt or completion tokens, more than 1024 prompt tokens or more
//! than 2048 in total (special tokens counted), stop at `num_prompts`, oversample if short.
//!
//! The file is scanned as a stream of records (the full file is 670 MB), so memory holds only
//! the two strings per record that sampling needs, and a truncated file is detected with the
//! byte offset of the cut.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::SeedableRng;
use serde::Deserialize;

use super::{DatasetError, SampleRequest};
use crate::tokenizer::Tokenizer;

/// A prompt and its reference completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub prompt: String,
    pub completion: String,
}

/// What reading the file found.
#[derive(Debug)]
pub struct Loaded {
    /// Records with at least two turns, in file order.
    pub conversations: Vec<Conversation>,
    /// All complete records, usable or not.
    pub records_read: usize,
    /// `Some(offset)` when the file ended inside a record (only with `allow_truncated`).
    pub truncated_at: Option<u64>,
}

#[derive(Deserialize)]
struct Record {
    #[serde(default)]
    conversations: Option<Vec<Turn>>,
}

#[derive(Deserialize)]
struct Turn {
    #[serde(default)]
    value: Option<String>,
}

/// Reads a ShareGPT JSON array record by record.
pub fn load(path: &Path, allow_truncated: bool) -> Result<Loaded, DatasetError> {
    let p = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| DatasetError::Io {
        path: p.clone(),
        source,
    })?;
    load_from(BufReader::with_capacity(1 << 20, file), &p, allow_truncated)
}

/// Scanner state over the raw bytes: finds each top-level record's extent by tracking strings,
/// escapes and nesting, then hands the record's bytes to serde_json.
pub fn load_from(
    mut reader: impl BufRead,
    path: &str,
    allow_truncated: bool,
) -> Result<Loaded, DatasetError> {
    let io = |source| DatasetError::Io {
        path: path.to_owned(),
        source,
    };
    let malformed = |offset: u64, detail: &str| DatasetError::Malformed {
        path: path.to_owned(),
        offset,
        detail: detail.to_owned(),
    };
    let mut out = Loaded {
        conversations: Vec::new(),
        records_read: 0,
        truncated_at: None,
    };
    let mut offset: u64 = 0;
    let mut seen_open = false;
    let mut closed = false;
    let mut rec: Vec<u8> = Vec::new();
    let mut rec_start: u64 = 0;
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    loop {
        let buf = reader.fill_buf().map_err(io)?;
        if buf.is_empty() {
            break;
        }
        let n = buf.len();
        let mut i = 0;
        while i < n {
            let b = buf[i];
            if depth == 0 {
                match b {
                    b' ' | b'\n' | b'\r' | b'\t' => {}
                    b'[' if !seen_open => seen_open = true,
                    b',' if seen_open && !closed => {}
                    b']' if seen_open && !closed => closed = true,
                    b'{' if seen_open && !closed => {
                        depth = 1;
                        rec.clear();
                        rec.push(b);
                        rec_start = offset + i as u64;
                    }
                    0xEF | 0xBB | 0xBF if offset + (i as u64) < 3 && !seen_open => {} // BOM
                    _ => {
                        return Err(malformed(
                            offset + i as u64,
                            &format!("unexpected byte {:?}", b as char),
                        ))
                    }
                }
                i += 1;
                continue;
            }
            // Inside a record: copy bytes up to the end of the record quickly.
            let start = i;
            while i < n {
                let c = buf[i];
                i += 1;
                if in_str {
                    if esc {
                        esc = false;
                    } else if c == b'\\' {
                        esc = true;
                    } else if c == b'"' {
                        in_str = false;
                    }
                } else {
                    match c {
                        b'"' => in_str = true,
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            rec.extend_from_slice(&buf[start..i]);
            if depth == 0 {
                let r: Record = serde_json::from_slice(&rec)
                    .map_err(|e| malformed(rec_start, &format!("record is not valid: {e}")))?;
                out.records_read += 1;
                if let Some(turns) = r.conversations {
                    if turns.len() >= 2 {
                        let mut it = turns.into_iter();
                        let prompt = it.next().and_then(|t| t.value).unwrap_or_default();
                        let completion = it.next().and_then(|t| t.value).unwrap_or_default();
                        out.conversations.push(Conversation { prompt, completion });
                    }
                }
            }
        }
        offset += n as u64;
        reader.consume(n);
    }
    if !seen_open {
        return Err(malformed(0, "no opening '[' found"));
    }
    if depth > 0 || !closed {
        let at = if depth > 0 { rec_start } else { offset };
        if !allow_truncated {
            return Err(DatasetError::Truncated {
                path: path.to_owned(),
                offset: at,
                records_read: out.records_read,
                records_read_plus_one: out.records_read + 1,
            });
        }
        out.truncated_at = Some(at);
    }
    Ok(out)
}

/// Reads everything from a `Read` (for tests with in-memory data).
pub fn load_bytes(data: impl Read, allow_truncated: bool) -> Result<Loaded, DatasetError> {
    load_from(BufReader::new(data), "<memory>", allow_truncated)
}

/// vLLM's `is_valid_sequence` with its defaults (strict comparisons).
pub fn is_valid(prompt_len: usize, output_len: usize, skip_min_output_check: bool) -> bool {
    !(prompt_len < 4
        || (!skip_min_output_check && output_len < 4)
        || prompt_len > 1024
        || prompt_len.saturating_add(output_len) > 2048)
}

/// Samples `num` requests: shuffle with `seed`, filter, oversample if the file had too few.
pub async fn sample(
    loaded: &Loaded,
    tokenizer: &Tokenizer,
    num: usize,
    output_len_override: Option<u64>,
    seed: u64,
) -> Result<Vec<SampleRequest>, DatasetError> {
    let mut order: Vec<usize> = (0..loaded.conversations.len()).collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    let mut out = Vec::with_capacity(num);
    // Tokenize in batches so that a remote tokenizer is kept busy.
    for batch in order.chunks(256) {
        if out.len() >= num {
            break;
        }
        let mut texts: Vec<&str> = Vec::with_capacity(batch.len() * 2);
        for &i in batch {
            let c = &loaded.conversations[i];
            texts.push(&c.prompt);
            if output_len_override.is_none() {
                texts.push(&c.completion);
            }
        }
        let counts = tokenizer.count_many(&texts, true).await?;
        let per = if output_len_override.is_none() { 2 } else { 1 };
        for (j, &i) in batch.iter().enumerate() {
            let prompt_len = counts[j * per];
            let output_len = match output_len_override {
                Some(o) => o as usize,
                None => counts[j * per + 1],
            };
            if !is_valid(prompt_len, output_len, output_len_override.is_some()) {
                continue;
            }
            out.push(SampleRequest {
                prompt: loaded.conversations[i].prompt.clone(),
                prompt_len: prompt_len as u64,
                expected_output_len: output_len as u64,
            });
            if out.len() >= num {
                break;
            }
        }
    }
    if out.is_empty() && num > 0 {
        return Err(DatasetError::Invalid(
            "no ShareGPT conversation passed the length filters (4 ≤ prompt ≤ 1024 tokens, total ≤ 2048)".into(),
        ));
    }
    // vLLM's maybe_oversample_requests: fill up with random picks of the accepted ones.
    if out.len() < num {
        tracing::warn!(
            accepted = out.len(),
            wanted = num,
            "ShareGPT: fewer valid conversations than requested; oversampling with repetition"
        );
        let mut rng = StdRng::seed_from_u64(seed);
        let pool = out.clone();
        while out.len() < num {
            out.push(pool.choose(&mut rng).expect("pool is not empty").clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::WordTokenizer;

    const DATA: &str = r#"[
      {"id": "a", "conversations": [{"from": "human", "value": "one two three four five"},
                                    {"from": "gpt", "value": "a b c d e f"}]},
      {"id": "b", "conversations": [{"from": "human", "value": "only one turn"}]},
      {"id": "c", "conversations": [{"from": "human", "value": "x {\"y\": [1]} \\\" z w"},
                                    {"from": "gpt", "value": "short"}]},
      {"id": "d", "conversations": []}
    ]"#;

    #[test]
    fn keeps_two_turn_records_and_counts_all() {
        let l = load_bytes(DATA.as_bytes(), false).unwrap();
        assert_eq!(l.records_read, 4);
        assert_eq!(l.conversations.len(), 2);
        assert_eq!(l.conversations[1].prompt, "x {\"y\": [1]} \\\" z w");
        assert!(l.truncated_at.is_none());
    }

    #[test]
    fn truncated_file_names_offset_and_records() {
        let cut = &DATA[..DATA.find("\"id\": \"c\"").unwrap() + 12];
        let err = load_bytes(cut.as_bytes(), false).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        assert!(err.contains("2 complete records"), "{err}");
        let start = cut.rfind('{').unwrap();
        assert!(err.contains(&format!("byte offset {start}")), "{err}");
        let l = load_bytes(cut.as_bytes(), true).unwrap();
        assert_eq!(l.records_read, 2);
        assert_eq!(l.truncated_at, Some(start as u64));
        // A missing closing bracket after a complete record is also a truncation.
        let no_close = DATA.trim_end().trim_end_matches(']');
        assert!(load_bytes(no_close.as_bytes(), false).is_err());
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let err = load_bytes(&b"{\"a\":1}"[..], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a ShareGPT JSON array"), "{err}");
        let err = load_bytes(&b"[{\"conversations\": 5}]"[..], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("record is not valid"), "{err}");
    }

    #[test]
    fn vllm_filter_rules() {
        assert!(is_valid(4, 4, false));
        assert!(!is_valid(3, 100, false));
        assert!(!is_valid(100, 3, false));
        assert!(is_valid(100, 3, true));
        assert!(is_valid(1024, 1024, false));
        assert!(!is_valid(1025, 10, false));
        assert!(!is_valid(1000, 1049, false));
    }

    #[tokio::test]
    async fn sampling_filters_is_seeded_and_oversamples() {
        let l = load_bytes(DATA.as_bytes(), false).unwrap();
        let tok = Tokenizer::Words(WordTokenizer { vocab_size: 100 });
        // "c" has a 1-word completion: filtered; only "a" passes, oversampled to 3.
        let s = sample(&l, &tok, 3, None, 7).await.unwrap();
        assert_eq!(s.len(), 3);
        assert!(s
            .iter()
            .all(|r| r.prompt_len == 5 && r.expected_output_len == 6));
        // With an output override the short completion no longer matters.
        let s = sample(&l, &tok, 2, Some(16), 7).await.unwrap();
        assert_eq!(s.iter().filter(|r| r.prompt.starts_with('x')).count(), 1);
        assert!(s.iter().all(|r| r.expected_output_len == 16));
        let again = sample(&l, &tok, 2, Some(16), 7).await.unwrap();
        assert_eq!(s, again);
    }
}
