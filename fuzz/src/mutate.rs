//! A small mutator for the stable smoke run (`tests/smoke.rs`): libFuzzer's usual moves
//! (bit flips, random and "interesting" bytes, inserts, deletes, repeats, splices with another
//! corpus input, dictionary tokens) without coverage feedback. It finds shallow crashes
//! cheaply in CI; the deep runs are libFuzzer's.

/// A deterministic generator (xorshift64*), so a failing smoke run repeats from its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced: xorshift needs a non-zero state).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

const INTERESTING: [&[u8]; 12] = [
    b"0",
    b"-1",
    b"4294967295",
    b"18446744073709551615",
    b"1e308",
    b"-0.0",
    b"NaN",
    b"null",
    b"\"\"",
    b"[]",
    b"{}",
    b"\xff\xff\xff\x7f",
];

/// Mutates `input` in place with 1–4 moves; the result is at most `max_len` bytes.
pub fn mutate(
    input: &mut Vec<u8>,
    corpus: &[Vec<u8>],
    dict: &[&[u8]],
    rng: &mut Rng,
    max_len: usize,
) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next_u64() as u8;
            }
            2 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                input.splice(i..i, bytes);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                input.drain(i..i + n);
            }
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                let copy = input[i..i + n].to_vec();
                let at = rng.below(len + 1);
                input.splice(at..at, copy);
            }
            5 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                input.truncate(cut);
                input.extend_from_slice(&other[from..]);
            }
            6 if !dict.is_empty() => {
                let token = dict[rng.below(dict.len())];
                let at = rng.below(len + 1);
                input.splice(at..at, token.iter().copied());
            }
            7 => {
                let token = INTERESTING[rng.below(INTERESTING.len())];
                let at = rng.below(len + 1);
                let n = rng.below((len - at).min(token.len()) + 1);
                input.splice(at..at + n, token.iter().copied());
            }
            _ if len > 0 => {
                // Overwrite a run with one repeated byte (long names, deep nesting).
                let b = [b'a', b'[', b'{', b'9', 0xff][rng.below(5)];
                let at = rng.below(len);
                let n = 1 + rng.below(256);
                input.splice(at..at, std::iter::repeat_n(b, n));
            }
            _ => input.push(rng.next_u64() as u8),
        }
        input.truncate(max_len);
    }
}

/// Tokens of a libFuzzer dictionary file (`name="value"` or `"value"` lines, `\xNN`, `\\` and
/// `\"` escapes); lines that do not parse are skipped.
pub fn parse_dict(text: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let (Some(start), Some(end)) = (line.find('"'), line.rfind('"')) else {
            continue;
        };
        if end <= start {
            continue;
        }
        let mut token = Vec::new();
        let mut bytes = line[start + 1..end].bytes();
        while let Some(b) = bytes.next() {
            if b != b'\\' {
                token.push(b);
                continue;
            }
            match bytes.next() {
                Some(b'x') => {
                    let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                    if let Some(v) = std::str::from_utf8(&hex)
                        .ok()
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                    {
                        token.push(v);
                    }
                }
                Some(other) => token.push(other),
                None => {}
            }
        }
        out.push(token);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_escapes_decode() {
        let d = parse_dict("# comment\nkey=\"\\x1eNodeNames\"\n\"a\\\"b\"\nbroken\n");
        assert_eq!(d, vec![b"\x1eNodeNames".to_vec(), b"a\"b".to_vec()]);
    }

    #[test]
    fn mutations_stay_within_the_length_and_repeat_from_a_seed() {
        let corpus = vec![b"{\"NodeNames\":[\"gpu-a\"]}".to_vec()];
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut input = corpus[0].clone();
            for _ in 0..1000 {
                mutate(&mut input, &corpus, &[b"Pod"], &mut rng, 64);
                assert!(input.len() <= 64);
            }
            input
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }
}
