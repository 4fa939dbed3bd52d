//! The bearer token: parsing the `Authorization` header and comparing in
//! constant time.

use std::fmt;

/// The server's secret. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(<{} bytes>)", self.0.len())
    }
}

/// Why a token cannot be used (the server exits 125).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenError {
    Empty,
    /// Whitespace or `=`: the client-side parsing would split it.
    Separator,
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::Empty => f.write_str("token is empty"),
            TokenError::Separator => f.write_str("token contains whitespace or '='"),
        }
    }
}

impl std::error::Error for TokenError {}

/// Check a token the server was given (file contents stripped of one
/// trailing newline by the shell, or the environment variable).
pub fn validate_token(raw: &[u8]) -> Result<Token, TokenError> {
    if raw.is_empty() {
        return Err(TokenError::Empty);
    }
    if raw.iter().any(|&b| is_separator(b)) {
        return Err(TokenError::Separator);
    }
    Ok(Token(raw.to_vec()))
}

impl Token {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

fn is_separator(b: u8) -> bool {
    b.is_ascii_whitespace() || b == b'='
}

/// The token a header value carries: its last whitespace/`=`-separated
/// piece (`Bearer T`, `Token=T`, or a bare `T`). `None` if there is none.
pub fn token_from_authorization(value: &[u8]) -> Option<&[u8]> {
    value.split(|&b| is_separator(b)).rfind(|piece| !piece.is_empty())
}

/// Does `candidate` equal the token? Constant time in the contents (the
/// length of the server's token is not a secret worth hiding).
pub fn token_matches(token: &Token, candidate: &[u8]) -> bool {
    let expected = token.as_bytes();
    // A length that differs is a mismatch already; every byte of the
    // expected token is still visited, so timing reveals no matching
    // prefix.
    let mut diff = u8::from(expected.len() != candidate.len());
    for (i, &e) in expected.iter().enumerate() {
        diff |= e ^ candidate.get(i).copied().unwrap_or(e);
    }
    std::hint::black_box(diff) == 0
}
