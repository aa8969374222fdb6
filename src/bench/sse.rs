//! Incremental Server-Sent Events decoder.
//!
//! Bytes arrive in arbitrary pieces (TCP reads, HTTP chunks); this module turns them into the
//! `data:` payloads of complete events, following the WHATWG event-stream rules that matter for
//! OpenAI-compatible servers: `\n`, `\r\n` and `\r` line ends, comment lines (`:`), fields other
//! than `data` ignored, multi-line `data` joined with `\n`, an event ends at a blank line.
//! It never allocates per byte and never panics on malformed input: a line that is not UTF-8 is
//! reported as an error for the caller to classify.

use thiserror::Error;

/// A problem with the byte stream itself (not with the JSON inside an event).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SseError {
    #[error("SSE line is not valid UTF-8 (at byte {offset} of the stream)")]
    NotUtf8 { offset: u64 },
    #[error("SSE line longer than {limit} bytes without a line end")]
    LineTooLong { limit: usize },
}

/// Upper bound on one line; a server that never sends a newline cannot exhaust memory.
const MAX_LINE: usize = 16 * 1024 * 1024;

/// Decoder state: an unfinished line and the `data` lines of the event being built.
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: String,
    has_data: bool,
    /// The previous byte was `\r`, so a following `\n` belongs to the same line end.
    after_cr: bool,
    consumed: u64,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a piece of the stream; calls `on_event` with each complete event's data.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        mut on_event: impl FnMut(&str),
    ) -> Result<(), SseError> {
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    self.consumed += 1;
                    continue;
                }
            }
            match bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(pos) => {
                    if self.line.is_empty() {
                        self.process_line(pos, bytes, &mut on_event)?;
                    } else {
                        self.line.extend_from_slice(&bytes[..pos]);
                        let line = std::mem::take(&mut self.line);
                        let r = self.process_line(line.len(), &line, &mut on_event);
                        self.line = line;
                        self.line.clear();
                        r?;
                    }
                    self.after_cr = bytes[pos] == b'\r';
                    self.consumed += pos as u64 + 1;
                    bytes = &bytes[pos + 1..];
                }
                None => {
                    if self.line.len() + bytes.len() > MAX_LINE {
                        return Err(SseError::LineTooLong { limit: MAX_LINE });
                    }
                    self.line.extend_from_slice(bytes);
                    self.consumed += bytes.len() as u64;
                    bytes = &[];
                }
            }
        }
        Ok(())
    }

    /// Ends the stream: an event whose blank line never came is still delivered, as browsers do
    /// not, but as every OpenAI client does (servers often end with `data: [DONE]\n` only).
    pub fn finish(&mut self, mut on_event: impl FnMut(&str)) -> Result<(), SseError> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.process_line(line.len(), &line, &mut on_event)?;
        }
        self.dispatch(&mut on_event);
        Ok(())
    }

    fn process_line(
        &mut self,
        len: usize,
        buf: &[u8],
        on_event: &mut impl FnMut(&str),
    ) -> Result<(), SseError> {
        let line = &buf[..len];
        if line.is_empty() {
            self.dispatch(on_event);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(()); // comment / keep-alive ping
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            let value = std::str::from_utf8(value).map_err(|_| SseError::NotUtf8 {
                offset: self.consumed,
            })?;
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        Ok(())
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(&str)) {
        if self.has_data {
            on_event(&self.data);
            self.data.clear();
            self.has_data = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(pieces: &[&[u8]]) -> Vec<String> {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for p in pieces {
            d.feed(p, |e| out.push(e.to_string())).unwrap();
        }
        d.finish(|e| out.push(e.to_string())).unwrap();
        out
    }

    #[test]
    fn parses_openai_stream() {
        let s = b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n";
        assert_eq!(decode_all(&[s]), vec!["{\"a\":1}", "{\"b\":2}", "[DONE]"]);
    }

    #[test]
    fn crlf_and_cr_line_ends_and_comments() {
        let s = b": ping\r\ndata: x\r\n\r\ndata:y\r\rdata: z\n\n";
        assert_eq!(decode_all(&[s]), vec!["x", "y", "z"]);
    }

    #[test]
    fn multi_line_data_and_other_fields() {
        let s = b"event: message\nid: 3\ndata: a\ndata: b\nretry: 10\n\n";
        assert_eq!(decode_all(&[s]), vec!["a\nb"]);
    }

    #[test]
    fn unterminated_last_event_is_delivered() {
        assert_eq!(decode_all(&[b"data: [DONE]"]), vec!["[DONE]"]);
        assert_eq!(decode_all(&[b"data: [DONE]\n"]), vec!["[DONE]"]);
    }

    #[test]
    fn invalid_utf8_is_an_error_not_a_panic() {
        let mut d = SseDecoder::new();
        let err = d.feed(b"data: \xff\xfe\n\n", |_| {}).unwrap_err();
        assert!(matches!(err, SseError::NotUtf8 { .. }));
    }

    fn stream_of(events: &[String], crlf: bool) -> Vec<u8> {
        let nl = if crlf { "\r\n" } else { "\n" };
        let mut s = String::new();
        for e in events {
            s.push_str("data: ");
            s.push_str(e);
            s.push_str(nl);
            s.push_str(nl);
        }
        s.into_bytes()
    }

    proptest! {
        /// Any split of the byte stream into pieces yields the same events.
        #[test]
        fn random_chunk_boundaries(
            events in proptest::collection::vec("[a-zA-Z0-9{}\":, é中]{0,40}", 0..20),
            cuts in proptest::collection::vec(0usize..2000, 0..30),
            crlf in any::<bool>(),
        ) {
            let bytes = stream_of(&events, crlf);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut prev = 0;
            for c in cuts {
                pieces.push(&bytes[prev..c]);
                prev = c;
            }
            pieces.push(&bytes[prev..]);
            let got = decode_all(&pieces);
            // An empty `data:` value is still an event; the generator may produce empty strings.
            prop_assert_eq!(got, events);
        }
    }
}
