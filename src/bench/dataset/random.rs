//! Random prompts with an exact token count, optionally behind a shared prefix, following
//! `vllm bench serve`'s `RandomDataset` (vllm/benchmarks/datasets/datasets.py): lengths drawn
//! uniformly in `[len·(1−r), len·(1+r)]`, token ids taken as a run from a random offset in the
//! vocabulary, then decoded and re-encoded until the prompt has exactly the target length (the
//! tokenizer round trip). servetune keeps adjusting where vLLM gives up after ten tries, and
//! reports any prompt that still misses its length.

use futures_util::{stream, StreamExt, TryStreamExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{DatasetError, SampleRequest};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub struct RandomSpec {
    pub num_prompts: usize,
    pub input_len: u64,
    pub output_len: u64,
    /// In `[0, 1)`.
    pub range_ratio: f64,
    pub prefix_len: u64,
    pub seed: u64,
}

/// Draws the lengths and builds every prompt.
pub async fn sample(
    spec: &RandomSpec,
    tokenizer: &Tokenizer,
) -> Result<Vec<SampleRequest>, DatasetError> {
    if !(0.0..1.0).contains(&spec.range_ratio) {
        return Err(DatasetError::Invalid(format!(
            "--random-range-ratio must be in [0, 1), got {}",
            spec.range_ratio
        )));
    }
    let vocab = tokenizer.vocab_size().await?.max(2);
    let ns = tokenizer.num_special_tokens().await? as u64;
    let real = spec.input_len.saturating_sub(ns);
    let r = spec.range_ratio;
    let in_lo = (real as f64 * (1.0 - r)).floor() as u64;
    let in_hi = (real as f64 * (1.0 + r)).ceil() as u64;
    let out_lo = ((spec.output_len as f64 * (1.0 - r)).floor() as u64).max(1);
    let out_hi = ((spec.output_len as f64 * (1.0 + r)).ceil() as u64).max(1);
    if spec.prefix_len.saturating_add(in_lo) < 1 {
        return Err(DatasetError::Invalid(format!(
            "random prompts would be empty: --random-input-len {} minus {} special token(s) with range ratio {} allows 0 tokens",
            spec.input_len, ns, r
        )));
    }
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let n = spec.num_prompts;
    let input_lens: Vec<u64> = (0..n).map(|_| rng.random_range(in_lo..=in_hi)).collect();
    let output_lens: Vec<u64> = (0..n).map(|_| rng.random_range(out_lo..=out_hi)).collect();
    let offsets: Vec<u32> = (0..n).map(|_| rng.random_range(0..vocab)).collect();

    let prefix: Vec<u32> = if spec.prefix_len > 0 {
        let ids: Vec<u32> = (0..spec.prefix_len)
            .map(|_| rng.random_range(0..vocab))
            .collect();
        let mut prng = StdRng::seed_from_u64(spec.seed ^ 0x5eed_0f9e_f1c5);
        fit_to_length(tokenizer, ids, spec.prefix_len as usize, vocab, &mut prng)
            .await?
            .0
    } else {
        Vec::new()
    };

    let jobs = (0..n).map(|i| {
        let mut seq = prefix.clone();
        let len = input_lens[i] as usize;
        seq.extend(
            (0..len).map(|j| ((offsets[i] as u64 + i as u64 + j as u64) % vocab as u64) as u32),
        );
        let target = prefix.len() + len;
        let seed = spec.seed.wrapping_add(1 + i as u64);
        let out = output_lens[i];
        async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let (ids, text) = fit_to_length(tokenizer, seq, target, vocab, &mut rng).await?;
            Ok::<_, DatasetError>((ids.len(), target, text, out))
        }
    });
    let built: Vec<(usize, usize, String, u64)> =
        stream::iter(jobs).buffered(8).try_collect().await?;
    let missed = built.iter().filter(|b| b.0 != b.1).count();
    if missed > 0 {
        tracing::warn!(
            missed,
            total = n,
            "random dataset: some prompts could not be brought to their exact token length"
        );
    }
    Ok(built
        .into_iter()
        .map(|(len, _, prompt, out)| SampleRequest {
            prompt,
            prompt_len: len as u64,
            expected_output_len: out,
        })
        .collect())
}

/// Decodes `ids` and re-encodes the text until the token count equals `target`: append random
/// tokens when short, truncate when long. Returns the final ids and their text.
async fn fit_to_length(
    tokenizer: &Tokenizer,
    mut ids: Vec<u32>,
    target: usize,
    vocab: u32,
    rng: &mut StdRng,
) -> Result<(Vec<u32>, String), DatasetError> {
    const MAX_ROUNDS: usize = 20;
    let mut text = tokenizer.decode(&ids).await?;
    for _ in 0..MAX_ROUNDS {
        ids = tokenizer.encode(&text, false).await?;
        if ids.len() == target {
            return Ok((ids, text));
        }
        if ids.len() < target {
            let extra = target - ids.len();
            ids.extend((0..extra).map(|_| rng.random_range(0..vocab)));
        } else {
            ids.truncate(target);
        }
        text = tokenizer.decode(&ids).await?;
    }
    // Not converged: report the text's real length, as vLLM does (`prompt_len = len(seq)`).
    let ids = tokenizer.encode(&text, false).await?;
    Ok((ids, text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::WordTokenizer;

    fn spec() -> RandomSpec {
        RandomSpec {
            num_prompts: 50,
            input_len: 100,
            output_len: 20,
            range_ratio: 0.5,
            prefix_len: 0,
            seed: 3,
        }
    }

    #[tokio::test]
    async fn exact_lengths_within_range_and_seeded() {
        let tok = Tokenizer::Words(WordTokenizer { vocab_size: 5000 });
        let a = sample(&spec(), &tok).await.unwrap();
        assert_eq!(a.len(), 50);
        for r in &a {
            assert!((50..=150).contains(&r.prompt_len), "{}", r.prompt_len);
            assert_eq!(
                tok.encode(&r.prompt, false).await.unwrap().len() as u64,
                r.prompt_len
            );
            assert!((10..=30).contains(&r.expected_output_len));
        }
        assert_eq!(a, sample(&spec(), &tok).await.unwrap());
        let mut other = spec();
        other.seed = 4;
        assert_ne!(a, sample(&other, &tok).await.unwrap());
    }

    #[tokio::test]
    async fn shared_prefix_is_shared() {
        let tok = Tokenizer::Words(WordTokenizer { vocab_size: 5000 });
        let mut s = spec();
        s.prefix_len = 30;
        s.range_ratio = 0.0;
        let a = sample(&s, &tok).await.unwrap();
        let head = |p: &str| p.split_whitespace().take(30).collect::<Vec<_>>().join(" ");
        assert!(a.iter().all(|r| head(&r.prompt) == head(&a[0].prompt)));
        assert!(a.iter().all(|r| r.prompt_len == 130));
        assert_ne!(a[0].prompt, a[1].prompt);
    }

    #[tokio::test]
    async fn bad_ratio_and_empty_prompts_are_errors() {
        let tok = Tokenizer::Words(WordTokenizer { vocab_size: 50 });
        let mut s = spec();
        s.range_ratio = 1.0;
        assert!(sample(&s, &tok)
            .await
            .unwrap_err()
            .to_string()
            .contains("[0, 1)"));
        let mut s = spec();
        s.input_len = 0;
        assert!(sample(&s, &tok)
            .await
            .unwrap_err()
            .to_string()
            .contains("empty"));
    }
}
