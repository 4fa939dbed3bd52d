//! A scanner for the plainest JSON: objects of members whose strings hold
//! no escape and no control character, integers written plainly, `true`,
//! `false` and `null`, with JSON whitespace between tokens. A fast path
//! reads the frames it expects with it and declines (`None`) anything
//! else, leaving that to a full parser that decides every case: so it
//! never has to be thorough, only never wrong about what it accepts.

/// A member's value: absent, `null`, or there.
pub type Slot<T> = Option<Option<T>>;

/// A position in a frame's bytes. Every reading method returns `None`
/// (decline) where the bytes are not what it reads.
pub struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Cursor { b, i: 0 }
    }

    /// Where the cursor stands, in bytes from the start.
    pub fn pos(&self) -> usize {
        self.i
    }

    /// Whitespace, then the end of the input.
    pub fn at_end(&mut self) -> bool {
        self.ws();
        self.i == self.b.len()
    }

    /// Skips JSON's whitespace (RFC 8259: space, tab, LF, CR).
    pub fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    pub fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    pub fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i.checked_add(word.len())?;
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// The bytes up to the next `"`, unchecked: a string's content if it
    /// holds no escape and no control character, which the caller checks.
    pub fn raw_string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let rest = self.b.get(self.i..)?;
        let len = memchr::memchr(b'"', rest)?;
        self.i += len + 1;
        Some(&rest[..len])
    }

    /// A string with no escape and no control character, as its bytes
    /// (not yet checked as UTF-8).
    pub fn string(&mut self) -> Option<&'a [u8]> {
        if let Some((s, end)) = self.plain_string() {
            self.i = end;
            return Some(s);
        }
        // Declining (or a case `plain_string` leaves alone): as ever, with
        // the cursor wherever this leaves it.
        let s = self.raw_string()?;
        plain(s).then_some(s)
    }

    /// [`Cursor::string`]'s answer where it is a string, and where the
    /// cursor then stands, without moving it: one pass, eight bytes at a
    /// time, to the first byte that is a quote, a backslash or a control
    /// character. A quote ends a plain string; anything else is left to
    /// the slower reading, which declines it. Cheaper than `memchr` and
    /// then [`plain`] over the same bytes, most of all for the short keys
    /// and values most strings here are.
    fn plain_string(&self) -> Option<(&'a [u8], usize)> {
        let rest = match self.b.get(self.i..)? {
            [b'"', rest @ ..] => rest,
            _ => return None,
        };
        let end = |len: usize| Some((&rest[..len], self.i + len + 2));
        let mut words = rest.chunks_exact(8);
        let mut at = 0;
        for word in &mut words {
            if at == LONG {
                return long_string(&rest[at..]).and_then(|len| end(at + len));
            }
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            let odd = odd_bytes(u64::from_le_bytes(w));
            if odd != 0 {
                // The lowest flagged byte is the first odd one (a test
                // flags a byte above a match at most, never below it).
                let first = at + (odd.trailing_zeros() / 8) as usize;
                return if rest[first] == b'"' { end(first) } else { None };
            }
            at += 8;
        }
        for &c in words.remainder() {
            if c == b'"' {
                return end(at);
            }
            if c < 0x20 || c == b'\\' {
                return None;
            }
            at += 1;
        }
        None
    }

    /// A [`Cursor::string`] that is UTF-8.
    pub fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.string()?).ok()
    }

    /// A non-negative integer written plainly (`0` or no leading zero)
    /// that fits a `u64`; a fraction or exponent declines.
    pub fn uint(&mut self) -> Option<u64> {
        let start = self.i;
        let mut n: u64 = 0;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        if digits == 0 || (digits > 1 && self.b[start] == b'0') {
            return None;
        }
        match self.peek() {
            Some(b'.' | b'e' | b'E') => None,
            _ => Some(n),
        }
    }

    /// `null`, or what `value` reads; each slot is set once.
    pub fn member<T>(
        &mut self,
        slot: &mut Slot<T>,
        value: impl FnOnce(&mut Self) -> Option<T>,
    ) -> Option<()> {
        if slot.is_some() {
            return None;
        }
        *slot = Some(if self.peek()? == b'n' {
            self.literal(b"null")?;
            None
        } else {
            Some(value(self)?)
        });
        Some(())
    }

    /// An object's members: `each` reads one value, given its key. The
    /// cursor stands on the `{`.
    pub fn object(&mut self, mut each: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            self.ws();
            let key = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            each(self, key)?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// What [`Cursor::text`] takes between the quotes: no backslash, no
/// control character, UTF-8. For bytes a caller took with
/// [`Cursor::raw_string`] and must, after all, read as JSON text.
pub fn is_text(s: &[u8]) -> bool {
    plain(s) && std::str::from_utf8(s).is_ok()
}

/// No backslash and no control character in `s`: eight bytes at a time
/// (the strings worth the trouble are a read's kilobytes of base64).
fn plain(s: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut words = s.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        let w = u64::from_le_bytes(w);
        // A byte below 0x20, and a byte equal to `\`, as a zero byte of
        // `w ^ 0x5c…`: each test is exact about whether any byte matches
        // (bytes from 0x80 up keep their high bit and never do).
        let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
        let x = w ^ (ONES * u64::from(b'\\'));
        let backslash = x.wrapping_sub(ONES) & !x & HIGH;
        if control | backslash != 0 {
            return false;
        }
    }
    words.remainder().iter().all(|&c| c >= 0x20 && c != b'\\')
}

/// Bytes of a string read word by word before the rest is read as a long
/// one ([`long_string`]).
const LONG: usize = 64;

/// The length of a plain string's rest up to its closing quote, `None`
/// where a backslash comes first or a control byte before it: the first
/// quote or backslash found by `memchr2`, and the bytes before it held to
/// no control byte by their least one (a reduction the compiler makes
/// vector-wide). For a read's or a write's kilobytes of base64, a fraction
/// of the word-by-word scan; for the short strings most are, slower.
fn long_string(rest: &[u8]) -> Option<usize> {
    let len = memchr::memchr2(b'"', b'\\', rest)?;
    let least = rest[..len].iter().fold(u8::MAX, |least, &c| least.min(c));
    (rest[len] == b'"' && least >= 0x20).then_some(len)
}

/// The high bit of each byte of `w` (little-endian) that is a control
/// character, a `\` or a `"`, as [`plain`] tests them; a byte above a
/// flagged one may be flagged too (a borrow), one below it never is.
fn odd_bytes(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    control | zero(w ^ (ONES * u64::from(b'\\'))) | zero(w ^ (ONES * u64::from(b'"')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn plain_is_the_byte_by_byte_test(
            s in proptest::collection::vec(
                prop_oneof![any::<u8>(), Just(b'\\'), 0x18u8..0x24, Just(0x7f), 0x80u8..0xff, Just(b'A')],
                0..40,
            ),
        ) {
            prop_assert_eq!(plain(&s), s.iter().all(|&c| c >= 0x20 && c != b'\\'));
        }
    }

    /// What `string` did before its short-string pass: the answer and
    /// where the cursor stands are the same for any bytes.
    fn string_as_before(c: &mut Cursor<'_>) -> Option<Vec<u8>> {
        let s = c.raw_string()?;
        plain(s).then(|| s.to_vec())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn string_reads_as_before(
            quoted in any::<bool>(),
            body in proptest::collection::vec(
                prop_oneof![
                    2 => Just(b'"'),
                    1 => Just(b'\\'),
                    1 => Just(0x1f),
                    12 => Just(b'a'),
                    2 => Just(0xc3),
                    2 => any::<u8>(),
                ],
                0..64,
            ),
            // A long plain run ahead of the body: the long reading.
            long in 0usize..160,
            at in 0usize..3,
        ) {
            let body = [vec![b'a'; long], body].concat();
            let b = if quoted { [&b"\""[..], &body].concat() } else { body };
            let (mut old, mut new) = (Cursor::new(&b), Cursor::new(&b));
            old.i = at.min(b.len());
            new.i = old.i;
            prop_assert_eq!(new.string().map(<[u8]>::to_vec), string_as_before(&mut old));
            prop_assert_eq!(new.pos(), old.pos());
        }
    }

    #[test]
    fn string_reads_as_before_with_any_byte_before_or_after_its_quote() {
        for odd in [0u8, 0x1f, 0x20, b'!', b'#', b'\\', 0x7f, 0x80, 0xa2, 0xdc, 0xff] {
            for quote in 0..150 {
                for at in 0..150 {
                    let mut b = [b'"'; 151];
                    b[1..].fill(b'a');
                    b[1 + quote] = b'"';
                    if at != quote {
                        b[1 + at] = odd;
                    }
                    let (mut old, mut new) = (Cursor::new(&b), Cursor::new(&b));
                    assert_eq!(new.string().map(<[u8]>::to_vec), string_as_before(&mut old), "{b:?}");
                    assert_eq!(new.pos(), old.pos());
                }
            }
        }
    }

    #[test]
    fn plain_finds_each_odd_byte_wherever_it_is() {
        for odd in [0u8, 0x1f, b'\\'] {
            for at in 0..24 {
                let mut s = vec![b'a'; 24];
                s[at] = odd;
                assert!(!plain(&s), "{odd:#x} at {at}");
            }
        }
        assert!(plain(&[0x20, 0x7f, 0x80, 0xff, b'/', b'"'].repeat(5)));
    }
}
