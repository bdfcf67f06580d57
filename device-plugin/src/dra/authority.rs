//! The kubelet's plugin-registration client is grpc-go dialling a Unix socket by its bare path,
//! so it sends that path as the HTTP/2 `:authority` (kubernetes/kubernetes#109081). A path is
//! not an authority: h2, under tonic, answers every such request with RST_STREAM
//! PROTOCOL_ERROR (hyperium/h2#487, declined), and the kubelet logs "failed to get plugin info"
//! forever. Measured on a real v1.37 kubelet: no Rust DRA or CSI plugin registers without a
//! workaround.
//!
//! [`AuthorityFix`] wraps each accepted connection and rewrites, in the client's HEADERS
//! frames, an `:authority` literal long enough to be such a path into `localhost` before h2
//! parses it. It only translates: no other byte changes, and a frame it cannot parse passes
//! unchanged (h2 then decides, as before).
//!
//! HPACK: the replacement is never longer than the value it replaces, so the server's
//! dynamic table holds entries no larger than the client's. It therefore evicts no entry the
//! client still refers to (both count indices from the newest entry), and the two tables stay
//! consistent without decoding Huffman strings.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The authority written instead of a socket path.
const REPLACEMENT: &[u8] = b"localhost";
/// HEADERS frame type and its flags.
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// HPACK static-table index of `:authority`.
const AUTHORITY_INDEX: u64 = 1;
/// Frames longer than this pass through without being buffered whole (h2 advertises 16 KiB).
const MAX_BUFFERED_FRAME: usize = 1 << 20;
/// The longest Huffman code is 30 bits: a Huffman string of `n` bytes decodes to at least
/// `n * 8 / 30` characters.
const HUFFMAN_MAX_CODE_BITS: usize = 30;

/// A connection whose client-sent `:authority` paths are rewritten (see the module docs).
#[derive(Debug)]
pub struct AuthorityFix<S> {
    inner: S,
    /// Bytes read from `inner` not yet framed.
    raw: Vec<u8>,
    /// Bytes ready for the reader, from `pos`.
    ready: Vec<u8>,
    pos: usize,
    preface_seen: bool,
    /// Not HTTP/2 as expected, or a frame too large to hold: the rest passes unchanged.
    passthrough: bool,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    /// Wraps an accepted connection.
    pub fn new(inner: S) -> Self {
        AuthorityFix {
            inner,
            raw: Vec::new(),
            ready: Vec::new(),
            pos: 0,
            preface_seen: false,
            passthrough: false,
            eof: false,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Moves every complete unit (the preface, whole frames) from `raw` to `ready`.
    fn frame(&mut self) {
        if self.passthrough || self.eof {
            self.ready.append(&mut self.raw);
            return;
        }
        if !self.preface_seen {
            if self.raw.len() < PREFACE.len() {
                if !PREFACE.starts_with(&self.raw) {
                    self.passthrough = true;
                    self.ready.append(&mut self.raw);
                }
                return;
            }
            if !self.raw.starts_with(PREFACE) {
                self.passthrough = true;
                self.ready.append(&mut self.raw);
                return;
            }
            self.ready.extend(self.raw.drain(..PREFACE.len()));
            self.preface_seen = true;
        }
        loop {
            if self.raw.len() < 9 {
                return;
            }
            let len = usize::from(self.raw[0]) << 16
                | usize::from(self.raw[1]) << 8
                | usize::from(self.raw[2]);
            if len > MAX_BUFFERED_FRAME {
                self.passthrough = true;
                self.ready.append(&mut self.raw);
                return;
            }
            if self.raw.len() < 9 + len {
                return;
            }
            let frame: Vec<u8> = self.raw.drain(..9 + len).collect();
            match (frame[3] == HEADERS)
                .then(|| rewrite_headers(&frame))
                .flatten()
            {
                Some(fixed) => self.ready.extend_from_slice(&fixed),
                None => self.ready.extend_from_slice(&frame),
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.pos < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.pos);
                buf.put_slice(&this.ready[this.pos..this.pos + n]);
                this.pos += n;
                if this.pos == this.ready.len() {
                    this.ready.clear();
                    this.pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let got = rb.filled();
                    if got.is_empty() {
                        this.eof = true;
                    } else {
                        this.raw.extend_from_slice(got);
                    }
                    this.frame();
                }
            }
        }
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// An HPACK prefix integer at `b[*i]` with an `n`-bit prefix; advances `i`.
fn int(b: &[u8], i: &mut usize, n: u32) -> Option<u64> {
    let mask = (1u16 << n) as u8 - 1;
    let mut v = u64::from(*b.get(*i)? & mask);
    *i += 1;
    if v < u64::from(mask) {
        return Some(v);
    }
    let mut shift = 0;
    loop {
        let byte = *b.get(*i)?;
        *i += 1;
        v += u64::from(byte & 0x7f).checked_shl(shift)?;
        shift += 7;
        if byte & 0x80 == 0 {
            return Some(v);
        }
        if shift > 28 {
            return None;
        }
    }
}

/// Skips an HPACK string at `b[*i]`; returns (start of its length prefix, Huffman, bytes).
fn string(b: &[u8], i: &mut usize) -> Option<(usize, bool, std::ops::Range<usize>)> {
    let at = *i;
    let huffman = *b.get(at)? & 0x80 != 0;
    let len = usize::try_from(int(b, i, 7)?).ok()?;
    let start = *i;
    let end = start.checked_add(len)?;
    (end <= b.len()).then_some(())?;
    *i = end;
    Some((at, huffman, start..end))
}

/// Whether an `:authority` value can only be a socket path or something as long, and is at
/// least as long as [`REPLACEMENT`] once decoded.
fn replaceable(huffman: bool, value: &[u8]) -> bool {
    if huffman {
        value.len() * 8 / HUFFMAN_MAX_CODE_BITS >= REPLACEMENT.len()
    } else {
        value.len() >= REPLACEMENT.len() && value.contains(&b'/')
    }
}

/// A header block with its `:authority` literal replaced, or `None` when it has none to
/// replace or does not parse.
fn rewrite_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut i = 0;
    while i < block.len() {
        let b = block[i];
        if b & 0x80 != 0 {
            int(block, &mut i, 7)?; // indexed field
            continue;
        }
        if b & 0xe0 == 0x20 {
            int(block, &mut i, 5)?; // dynamic table size update
            continue;
        }
        // A literal: with incremental indexing (6-bit name index), else 4-bit.
        let prefix = if b & 0xc0 == 0x40 { 6 } else { 4 };
        let name = int(block, &mut i, prefix)?;
        if name == 0 {
            string(block, &mut i)?;
        }
        let (at, huffman, value) = string(block, &mut i)?;
        if name == AUTHORITY_INDEX && replaceable(huffman, &block[value.clone()]) {
            let mut out = Vec::with_capacity(block.len());
            out.extend_from_slice(&block[..at]);
            out.push(REPLACEMENT.len() as u8); // fits the 7-bit prefix, no Huffman
            out.extend_from_slice(REPLACEMENT);
            out.extend_from_slice(&block[value.end..]);
            return Some(out);
        }
    }
    None
}

/// A HEADERS frame (header included) with its `:authority` path replaced, or `None` to pass it
/// unchanged (no path, a block continued in CONTINUATION frames, or a parse failure).
fn rewrite_headers(frame: &[u8]) -> Option<Vec<u8>> {
    let flags = frame[4];
    if flags & END_HEADERS == 0 {
        return None;
    }
    let payload = &frame[9..];
    let mut start = 0;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*payload.first()?);
        start = 1;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    let end = payload.len().checked_sub(pad)?;
    (start <= end).then_some(())?;
    let block = rewrite_block(&payload[start..end])?;
    let len = start + block.len() + pad;
    let mut out = Vec::with_capacity(9 + len);
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8]);
    out.extend_from_slice(&frame[3..9]);
    out.extend_from_slice(&payload[..start]);
    out.extend_from_slice(&block);
    out.extend_from_slice(&payload[end..]);
    tracing::debug!(
        "rewrote a client's socket-path :authority to localhost (kubernetes/kubernetes#109081)"
    );
    Some(out)
}

#[cfg(test)]
#[path = "authority_tests.rs"]
mod tests;
