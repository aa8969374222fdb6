//! Token counting for datasets and for the output-token fallback.
//!
//! Three tokenizers:
//! - a Hugging Face `tokenizer.json` loaded offline with Hugging Face's own Rust `tokenizers`
//!   crate (what `vllm bench serve --tokenizer` loads, through the same library), from a local
//!   model directory, a `tokenizer.json` file, or a hub id already in the local HF cache;
//! - the serving engine's own (`POST /tokenize`, `POST /detokenize`, which llama-server, vLLM
//!   and SGLang expose), so that counts match the server exactly when no local tokenizer is known;
//! - a deterministic word tokenizer that the mock engine also uses (tests and offline runs).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{stream, StreamExt, TryStreamExt};
use serde_json::{json, Value};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("tokenizer endpoint {url} failed: {message}")]
    Remote { url: String, message: String },
    #[error("tokenizer endpoint {url} answered without {field}: {body}")]
    BadResponse {
        url: String,
        field: &'static str,
        body: String,
    },
    #[error("the vocabulary size is unknown: the server's /v1/models does not report meta.n_vocab and names no local model directory; pass --tokenizer DIR (a Hugging Face tokenizer) or --random-vocab-size")]
    UnknownVocab,
    /// A local Hugging Face tokenizer that cannot be found, read or used.
    #[error("tokenizer {path}: {message}")]
    Local { path: String, message: String },
}

/// The `tokenizer.json` a local path means: the file itself, or the one inside a directory.
fn tokenizer_file(path: &Path) -> Result<PathBuf, TokenizerError> {
    let err = |message: &str| TokenizerError::Local {
        path: path.display().to_string(),
        message: message.into(),
    };
    if path.is_dir() {
        let f = path.join("tokenizer.json");
        return if f.is_file() {
            Ok(f)
        } else {
            Err(err("the directory has no tokenizer.json (only Hugging Face fast tokenizers are supported)"))
        };
    }
    if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        Err(err("no such file or directory"))
    }
}

/// A Hugging Face tokenizer (`tokenizer.json`), loaded from local files only.
#[derive(Clone)]
pub struct HfTokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// Where it was loaded from (errors and the results' tokenizer id).
    pub path: PathBuf,
    /// The base vocabulary without added tokens: what `transformers`' `vocab_size` reports and
    /// what `vllm bench serve`'s random dataset draws token ids from.
    pub vocab_size: u32,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

impl HfTokenizer {
    /// Loads `tokenizer.json` (a file, or the file inside a directory).
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let file = tokenizer_file(path)?;
        let err = |message: String| TokenizerError::Local {
            path: file.display().to_string(),
            message,
        };
        let inner = tokenizers::Tokenizer::from_file(&file).map_err(|e| err(e.to_string()))?;
        let vocab_size = inner.get_vocab_size(false) as u32;
        if vocab_size < 2 {
            return Err(err(format!("a vocabulary of {vocab_size} tokens")));
        }
        Ok(HfTokenizer {
            inner: Arc::new(inner),
            path: file,
            vocab_size,
        })
    }

    fn hf_err(&self, e: tokenizers::Error) -> TokenizerError {
        TokenizerError::Local {
            path: self.path.display().to_string(),
            message: e.to_string(),
        }
    }

    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| self.hf_err(e))
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner.decode(ids, false).map_err(|e| self.hf_err(e))
    }
}

/// The Hugging Face cache's hub folder: `$HF_HUB_CACHE`, `$HF_HOME/hub` or
/// `~/.cache/huggingface/hub`, as `huggingface_hub` resolves it.
fn hf_hub_cache() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(p).join("hub"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
}

/// Finds the `tokenizer.json` a name refers to, offline: a local directory or file, or a hub id
/// (`org/name`) whose snapshot is in the local HF cache (the `refs/main` snapshot first, then
/// any). `Ok(None)` when the name is a hub id that is not cached; an error when it is a path
/// that does not hold a tokenizer.
pub fn locate(name: &str, hub_cache: Option<&Path>) -> Result<Option<PathBuf>, TokenizerError> {
    let p = Path::new(name);
    // A path (it exists, or it can only be one) is a local tokenizer or an error naming it.
    if p.exists() || p.is_absolute() || name.starts_with('.') || name.starts_with('~') {
        return tokenizer_file(p).map(Some);
    }
    let Some(cache) = hub_cache else {
        return Ok(None);
    };
    let repo = cache.join(format!("models--{}", name.replace('/', "--")));
    let snapshots = repo.join("snapshots");
    if let Ok(main) = std::fs::read_to_string(repo.join("refs").join("main")) {
        let f = snapshots.join(main.trim()).join("tokenizer.json");
        if f.is_file() {
            return Ok(Some(f));
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path().join("tokenizer.json"))
        .filter(|f| f.is_file())
        .collect();
    found.sort();
    Ok(found.pop())
}

/// `locate` with the user's HF cache, then loads what it finds.
pub fn load_local(name: &str) -> Result<Option<HfTokenizer>, TokenizerError> {
    match locate(name, hf_hub_cache().as_deref())? {
        Some(f) => HfTokenizer::load(&f).map(Some),
        None => Ok(None),
    }
}

/// Words of the form `t<id>` map to `<id>`; other words hash into the vocabulary.
#[derive(Debug, Clone)]
pub struct WordTokenizer {
    pub vocab_size: u32,
}

impl WordTokenizer {
    pub fn encode(&self, text: &str) -> Vec<u32> {
        text.split_whitespace().map(|w| self.word_id(w)).collect()
    }
    pub fn count(&self, text: &str) -> usize {
        text.split_whitespace().count()
    }
    fn word_id(&self, w: &str) -> u32 {
        if let Some(n) = w.strip_prefix('t').and_then(|d| d.parse::<u32>().ok()) {
            // Only the canonical spelling maps back ("t05" hashes like any other word).
            if n < self.vocab_size && w[1..] == n.to_string() {
                return n;
            }
        }
        // FNV-1a
        let mut h: u32 = 0x811c_9dc5;
        for b in w.bytes() {
            h ^= b as u32;
            h = h.wrapping_mul(0x0100_0193);
        }
        h % self.vocab_size
    }
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut s = String::with_capacity(ids.len() * 6);
        for (i, id) in ids.iter().enumerate() {
            if i > 0 {
                s.push(' ');
            }
            s.push('t');
            s.push_str(&(id % self.vocab_size).to_string());
        }
        s
    }
}

/// The engine's tokenizer over HTTP.
#[derive(Debug, Clone)]
pub struct RemoteTokenizer {
    client: reqwest::Client,
    base_url: String,
    model: String,
    /// Vocabulary size given by the user, for servers that do not report it.
    vocab: Option<u32>,
}

/// How many tokenizer calls run at once.
const PARALLEL: usize = 8;

impl RemoteTokenizer {
    pub fn new(base_url: &str, model: &str) -> Self {
        RemoteTokenizer {
            client: reqwest::Client::builder()
                .http1_only()
                .pool_idle_timeout(crate::util::ENGINE_POOL_IDLE)
                .timeout(Duration::from_secs(60))
                .build()
                .expect("a client without TLS always builds"),
            base_url: base_url.trim_end_matches('/').to_owned(),
            model: model.to_owned(),
            vocab: None,
        }
    }

    /// Sends a request, once more if it failed before any answer came (the connection was
    /// refused or closed under it): the tokenizer's calls have no side effect, so a second
    /// attempt is safe, and it covers a server whose keep-alive is shorter than
    /// `ENGINE_POOL_IDLE`.
    async fn send(
        &self,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, reqwest::Error> {
        match request().send().await {
            Err(e) if e.is_connect() || e.is_request() => {
                tracing::debug!("tokenizer request failed before an answer ({e}); once more");
                request().send().await
            }
            other => other,
        }
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, TokenizerError> {
        let url = format!("{}{}", self.base_url, path);
        let err = |m: String| TokenizerError::Remote {
            url: url.clone(),
            message: m,
        };
        let resp = self
            .send(|| self.client.post(&url).json(&body))
            .await
            .map_err(|e| err(e.to_string()))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| err(e.to_string()))?;
        if !status.is_success() {
            return Err(err(format!("HTTP {}: {}", status.as_u16(), text.trim())));
        }
        serde_json::from_str(&text).map_err(|e| err(format!("invalid JSON ({e})")))
    }

    pub async fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        // llama-server reads `content`/`add_special`, vLLM and SGLang `prompt`/`add_special_tokens`.
        let v = self
            .post(
                "/tokenize",
                json!({"model": self.model, "content": text, "prompt": text,
                       "add_special": add_special, "add_special_tokens": add_special}),
            )
            .await?;
        let tokens = v
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(|| self.bad("/tokenize", "tokens", &v))?;
        Ok(tokens
            .iter()
            .filter_map(|t| {
                t.as_u64()
                    .or_else(|| t.get("id").and_then(Value::as_u64))
                    .map(|x| x as u32)
            })
            .collect())
    }

    pub async fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let v = self
            .post("/detokenize", json!({"model": self.model, "tokens": ids}))
            .await?;
        v.get("content")
            .or_else(|| v.get("prompt"))
            .or_else(|| v.get("text"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| self.bad("/detokenize", "content", &v))
    }

    fn bad(&self, path: &str, field: &'static str, v: &Value) -> TokenizerError {
        let body = crate::util::excerpt(&v.to_string(), 200);
        TokenizerError::BadResponse {
            url: format!("{}{}", self.base_url, path),
            field,
            body,
        }
    }

    /// `meta.n_vocab` of the first model in `/v1/models` (llama-server and the mock report it).
    pub async fn vocab_size(&self) -> Result<u32, TokenizerError> {
        if let Some(v) = self.vocab {
            return Ok(v);
        }
        let url = format!("{}/v1/models", self.base_url);
        let v: Value = self
            .send(|| self.client.get(&url))
            .await
            .map_err(|e| TokenizerError::Remote {
                url: url.clone(),
                message: e.to_string(),
            })?
            .json()
            .await
            .map_err(|e| TokenizerError::Remote {
                url: url.clone(),
                message: e.to_string(),
            })?;
        v.pointer("/data/0/meta/n_vocab")
            .or_else(|| v.pointer("/models/0/meta/n_vocab"))
            .and_then(Value::as_u64)
            .map(|n| n as u32)
            .ok_or(TokenizerError::UnknownVocab)
    }
}

impl Tokenizer {
    /// Overrides the vocabulary size a remote tokenizer reports (or fails to report).
    pub fn with_vocab(self, v: u32) -> Self {
        match self {
            Tokenizer::Remote(mut r) => {
                r.vocab = Some(v);
                Tokenizer::Remote(r)
            }
            Tokenizer::Words(_) => Tokenizer::Words(WordTokenizer { vocab_size: v }),
            Tokenizer::Hf(mut h) => {
                h.vocab_size = v;
                Tokenizer::Hf(h)
            }
        }
    }
}

/// Either tokenizer, behind one interface.
#[derive(Debug, Clone)]
pub enum Tokenizer {
    Remote(RemoteTokenizer),
    Words(WordTokenizer),
    Hf(HfTokenizer),
}

impl Tokenizer {
    pub async fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        match self {
            Tokenizer::Remote(r) => r.encode(text, add_special).await,
            Tokenizer::Words(w) => Ok(w.encode(text)),
            Tokenizer::Hf(h) => h.encode(text, add_special),
        }
    }

    pub async fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        match self {
            Tokenizer::Remote(r) => r.decode(ids).await,
            Tokenizer::Words(w) => Ok(w.decode(ids)),
            Tokenizer::Hf(h) => h.decode(ids),
        }
    }

    /// Token counts of many texts, in order, several requests at a time.
    pub async fn count_many(
        &self,
        texts: &[&str],
        add_special: bool,
    ) -> Result<Vec<usize>, TokenizerError> {
        match self {
            Tokenizer::Words(w) => Ok(texts.iter().map(|t| w.count(t)).collect()),
            Tokenizer::Hf(h) => texts
                .iter()
                .map(|t| h.encode(t, add_special).map(|v| v.len()))
                .collect(),
            Tokenizer::Remote(_) => {
                stream::iter(
                    texts
                        .iter()
                        .map(|t| async move { self.encode(t, add_special).await.map(|v| v.len()) }),
                )
                .buffered(PARALLEL)
                .try_collect()
                .await
            }
        }
    }

    /// How many special tokens the tokenizer adds to a prompt (1 for a BOS tokenizer).
    pub async fn num_special_tokens(&self) -> Result<usize, TokenizerError> {
        let with = self.encode("hello", true).await?.len();
        let without = self.encode("hello", false).await?.len();
        Ok(with.saturating_sub(without))
    }

    pub async fn vocab_size(&self) -> Result<u32, TokenizerError> {
        match self {
            Tokenizer::Remote(r) => r.vocab_size().await,
            Tokenizer::Words(w) => Ok(w.vocab_size),
            Tokenizer::Hf(h) => Ok(h.vocab_size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_tokenizer_round_trips() {
        let w = WordTokenizer { vocab_size: 1000 };
        let ids = vec![0, 5, 999, 10];
        assert_eq!(w.encode(&w.decode(&ids)), ids);
        assert_eq!(w.count("a b  c\n d"), 4);
        assert!(w.encode("hello world").iter().all(|&i| i < 1000));
        // "t05" is not the canonical spelling of 5, so it hashes.
        assert_eq!(w.encode("t5"), vec![5]);
    }

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf-tokenizer")
    }

    /// The fixture is a 12-word WordLevel tokenizer with a `<s>` BOS template: encoding honours
    /// `add_special` (vLLM's prompts are counted with it), the vocabulary is the base one, and
    /// the random dataset builds prompts of its words with exact lengths.
    #[tokio::test]
    async fn a_hugging_face_tokenizer_json_encodes_counts_and_builds_random_prompts() {
        let t = HfTokenizer::load(&fixture()).unwrap();
        assert_eq!(t.vocab_size, 12);
        assert_eq!(t.encode("the cat sat", true).unwrap(), vec![0, 2, 3, 4]);
        assert_eq!(t.encode("the cat sat", false).unwrap(), vec![2, 3, 4]);
        assert_eq!(t.encode("the zebra", false).unwrap(), vec![2, 1]);
        assert_eq!(t.decode(&[2, 8, 9]).unwrap(), "the dog ran");
        let tok = Tokenizer::Hf(t.clone());
        assert_eq!(tok.num_special_tokens().await.unwrap(), 1);
        assert_eq!(
            tok.count_many(&["a cat", "the"], false).await.unwrap(),
            vec![2, 1]
        );
        let spec = crate::bench::dataset::random::RandomSpec {
            num_prompts: 20,
            input_len: 17,
            output_len: 4,
            range_ratio: 0.0,
            prefix_len: 0,
            seed: 1,
        };
        let prompts = crate::bench::dataset::random::sample(&spec, &tok)
            .await
            .unwrap();
        for p in &prompts {
            // 16 tokens of text + the BOS the server adds = 17.
            assert_eq!(p.prompt_len, 16, "{:?}", p.prompt);
            assert_eq!(
                t.encode(&p.prompt, false).unwrap().len(),
                16,
                "{:?}",
                p.prompt
            );
        }
        // A vocabulary override applies to the HF tokenizer too.
        assert!(matches!(tok.with_vocab(5), Tokenizer::Hf(h) if h.vocab_size == 5));
    }

    /// A path is a local tokenizer or an error naming it; a hub id is looked up in the HF cache
    /// (`refs/main`'s snapshot), and an id that is not cached is `None` (the caller falls back
    /// to the server's tokenizer).
    #[test]
    fn tokenizers_are_found_by_path_or_in_the_hub_cache() {
        let dir = fixture();
        let dir_s = dir.to_str().unwrap();
        assert_eq!(
            locate(dir_s, None).unwrap().unwrap(),
            dir.join("tokenizer.json")
        );
        let file = dir.join("tokenizer.json");
        assert_eq!(locate(file.to_str().unwrap(), None).unwrap().unwrap(), file);
        let empty = tempfile::tempdir().unwrap();
        let e = locate(empty.path().to_str().unwrap(), None).unwrap_err();
        assert!(e.to_string().contains("no tokenizer.json"), "{e}");
        let e = locate("/no/such/tokenizer", None).unwrap_err();
        assert!(e.to_string().contains("/no/such/tokenizer"), "{e}");
        assert!(e.to_string().contains("no such file"), "{e}");

        let hub = tempfile::tempdir().unwrap();
        assert!(locate("org/model", Some(hub.path())).unwrap().is_none());
        let repo = hub.path().join("models--org--model");
        for snap in ["aaa", "bbb"] {
            let d = repo.join("snapshots").join(snap);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::copy(&file, d.join("tokenizer.json")).unwrap();
        }
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "aaa\n").unwrap();
        assert_eq!(
            locate("org/model", Some(hub.path())).unwrap().unwrap(),
            repo.join("snapshots/aaa/tokenizer.json")
        );
        assert!(load_local(dir_s).unwrap().is_some());
    }
}
