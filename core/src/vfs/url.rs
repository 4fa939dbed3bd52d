//! URLs as the server will see them (RFC 3986): `http.get`/`http.post`
//! are decided on, and sent as, the normalized form, so a prefix check
//! cannot be talked past with encodings a server decodes afterwards.
//!
//! Normalization: scheme and host lowercased; an explicit default port
//! dropped; in the path, percent-encoded unreserved characters decoded
//! (§6.2.2.2), other escapes' hex uppercased (§6.2.2.1), then dot segments
//! removed (§5.2.4). Anything a server or a parser could read two ways is
//! refused instead: encoded separators (`%2f`, `%5c`), a dot segment
//! spelled with `%2e`, backslashes, userinfo, fragments, malformed escapes,
//! characters outside RFC 3986's sets, non-ASCII, hosts that are not a
//! lowercase-able DNS name, a dotted-decimal IPv4 address or a canonical
//! IPv6 literal (`2130706433`, `0x7f.1`, `[0:0::1]`), and ports with
//! leading zeros, empty or zero.

use std::fmt;

/// A URL taken apart and normalized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedUrl {
    /// `http` or `https`.
    pub scheme: String,
    /// Lowercase; an IPv6 literal keeps its brackets.
    pub host: String,
    pub port: u16,
    /// Starts with `/`; no dot segments.
    pub path: String,
    /// Without the `?`.
    pub query: Option<String>,
}

impl CheckedUrl {
    fn default_port(&self) -> u16 {
        if self.scheme == "https" {
            443
        } else {
            80
        }
    }
}

/// The normalized URL: what the request is sent to.
impl fmt::Display for CheckedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.host)?;
        if self.port != self.default_port() {
            write!(f, ":{}", self.port)?;
        }
        f.write_str(&self.path)?;
        if let Some(q) = &self.query {
            write!(f, "?{q}")?;
        }
        Ok(())
    }
}

/// Why a URL is refused. [`UrlError::is_policy`] tells a refusal the
/// policy makes (`-32001`) from a malformed URL (`-32602`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UrlError {
    Malformed(String),
    /// Well-formed, but refused as ambiguous or as carrying credentials.
    Refused(String),
}

impl UrlError {
    pub fn is_policy(&self) -> bool {
        matches!(self, UrlError::Refused(_))
    }
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlError::Malformed(s) | UrlError::Refused(s) => f.write_str(s),
        }
    }
}

fn malformed(s: impl Into<String>) -> UrlError {
    UrlError::Malformed(s.into())
}

fn refused(s: impl Into<String>) -> UrlError {
    UrlError::Refused(s.into())
}

/// Longest URL taken, in bytes: a request line must stay reasonable.
pub const MAX_URL_LEN: usize = 8192;

/// Parse and normalize an absolute `http`/`https` URL.
pub fn normalize(text: &str) -> Result<CheckedUrl, UrlError> {
    if text.len() > MAX_URL_LEN {
        return Err(malformed(format!("longer than {MAX_URL_LEN} bytes")));
    }
    if let Some(b) = text.bytes().find(|b| !b.is_ascii() || b.is_ascii_control() || *b == b' ') {
        return Err(malformed(if b.is_ascii() {
            "control characters or spaces".to_string()
        } else {
            "non-ASCII characters (percent-encode them)".to_string()
        }));
    }
    if text.contains('\\') {
        return Err(refused("backslashes are refused (some parsers read them as '/')"));
    }
    if text.contains('#') {
        return Err(refused("fragments are refused"));
    }
    let (scheme, rest) = text.split_once("://").ok_or_else(|| malformed("not an absolute http(s) URL"))?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(malformed(format!("scheme {scheme:?} is not http or https")));
    }
    let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, rest) = rest.split_at(auth_end);
    if authority.contains('@') {
        return Err(refused(USERINFO_REFUSED));
    }
    let (host, port) = split_port(authority)?;
    let host = check_host(host)?;
    let default = if scheme == "https" { 443 } else { 80 };
    let port = match port {
        None => default,
        Some(p) => parse_port(p)?,
    };
    let (raw_path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let path = normalize_path(raw_path)?;
    let query = match query {
        Some(q) => Some(check_query(q)?),
        None => None,
    };
    Ok(CheckedUrl { scheme, host, port, path, query })
}

const USERINFO_REFUSED: &str = "userinfo is refused";

fn split_port(authority: &str) -> Result<(&str, Option<&str>), UrlError> {
    if authority.starts_with('[') {
        let end = authority.find(']').ok_or_else(|| malformed("unclosed '[' in the host"))?;
        let (host, after) = authority.split_at(end + 1);
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((host, Some(p))),
                None => Err(malformed("junk after the IPv6 host")),
            },
        };
    }
    Ok(match authority.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    })
}

fn parse_port(p: &str) -> Result<u16, UrlError> {
    if p.is_empty() {
        return Err(refused("an empty port is refused"));
    }
    if !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(format!("port {p:?} is not a number")));
    }
    if p.len() > 1 && p.starts_with('0') {
        return Err(refused(format!("port {p:?} has leading zeros")));
    }
    match p.parse::<u16>() {
        Ok(0) => Err(refused("port 0 is refused")),
        Ok(n) => Ok(n),
        Err(_) => Err(malformed(format!("port {p:?} is out of range"))),
    }
}

/// A DNS name (letters, digits, `-`, non-empty labels, the last not
/// numeric), a dotted-decimal IPv4 address, or an IPv6 literal as
/// RFC 5952 writes it. Whatever else a resolver might make of a host is
/// refused rather than guessed.
fn check_host(host: &str) -> Result<String, UrlError> {
    if host.is_empty() {
        return Err(malformed("no host"));
    }
    let host = host.to_ascii_lowercase();
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let addr: std::net::Ipv6Addr =
            inner.parse().map_err(|_| malformed(format!("{host} is not an IPv6 address")))?;
        if inner.contains('.') || addr.to_string() != inner {
            return Err(refused(format!("IPv6 host {host} is not in its canonical form [{addr}]")));
        }
        return Ok(host);
    }
    // Labels are walked, never collected: a host of many dots costs no
    // slice per label.
    if host.split('.').any(str::is_empty) {
        return Err(refused(format!("host {host:?} has an empty label")));
    }
    if !host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') {
        return Err(malformed(format!("host {host:?} holds characters a host name cannot")));
    }
    // WHATWG parsers and resolvers read a numeric last label as an IPv4
    // address in decimal, octal or hex, in one to four parts.
    let last = host.rsplit('.').next().unwrap_or_default();
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || (last.starts_with("0x") && last[2..].bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        let canonical = host.split('.').count() == 4
            && host.split('.').all(|l| {
                l.bytes().all(|b| b.is_ascii_digit())
                    && (l.len() == 1 || !l.starts_with('0'))
                    && l.parse::<u8>().is_ok()
            });
        if !canonical {
            return Err(refused(format!("host {host:?} is not a dotted-decimal IPv4 address")));
        }
    }
    Ok(host)
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn is_sub_delim(b: u8) -> bool {
    matches!(b, b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=')
}

fn is_pchar(b: u8) -> bool {
    is_unreserved(b) || is_sub_delim(b) || b == b':' || b == b'@'
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// One segment, its escapes normalized; whether it held an escaped `.`.
fn normalize_segment(seg: &str) -> Result<(String, bool), UrlError> {
    let b = seg.as_bytes();
    let mut out = String::with_capacity(seg.len());
    let mut encoded_dot = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            let (Some(hi), Some(lo)) =
                (b.get(i + 1).and_then(|&x| hex(x)), b.get(i + 2).and_then(|&x| hex(x)))
            else {
                return Err(malformed("a '%' not followed by two hex digits"));
            };
            let v = hi * 16 + lo;
            if v == b'/' || v == b'\\' {
                return Err(refused("an encoded '/' or '\\' (%2F, %5C) is refused"));
            }
            if is_unreserved(v) {
                encoded_dot |= v == b'.';
                out.push(v as char);
            } else {
                out.push_str(&format!("%{v:02X}"));
            }
            i += 3;
        } else if is_pchar(c) {
            out.push(c as char);
            i += 1;
        } else {
            return Err(malformed(format!(
                "{:?} is not allowed in a URL path (percent-encode it)",
                c as char
            )));
        }
    }
    Ok((out, encoded_dot))
}

/// RFC 3986 §5.2.4 over normalized segments.
fn normalize_path(raw: &str) -> Result<String, UrlError> {
    if raw.is_empty() {
        return Ok("/".into());
    }
    let Some(raw) = raw.strip_prefix('/') else {
        return Err(malformed("the path does not start with '/'"));
    };
    // The output is built as "/seg" for each kept segment, in one string:
    // a list of segments would cost an entry per segment, up to dozens of
    // bytes per byte of a path of empty segments ("////…").
    let mut out = String::with_capacity(raw.len() + 1);
    let mut segs = raw.split('/').peekable();
    while let Some(seg) = segs.next() {
        let (seg, encoded_dot) = normalize_segment(seg)?;
        let dot = seg == "." || seg == "..";
        if dot && encoded_dot {
            return Err(refused("a dot segment spelled with %2E is refused"));
        }
        let last = segs.peek().is_none();
        match seg.as_str() {
            "." => {
                if last {
                    out.push('/');
                }
            }
            ".." => {
                // A segment holds no '/' (an escaped one stays escaped).
                if let Some(i) = out.rfind('/') {
                    out.truncate(i);
                }
                if last {
                    out.push('/');
                }
            }
            _ => {
                out.push('/');
                out.push_str(&seg);
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

fn check_query(q: &str) -> Result<String, UrlError> {
    let b = q.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            if b.get(i + 1).and_then(|&x| hex(x)).is_none() || b.get(i + 2).and_then(|&x| hex(x)).is_none() {
                return Err(malformed("a '%' not followed by two hex digits"));
            }
            i += 3;
        } else if is_pchar(c) || c == b'/' || c == b'?' {
            i += 1;
        } else {
            return Err(malformed(format!(
                "{:?} is not allowed in a URL query (percent-encode it)",
                c as char
            )));
        }
    }
    Ok(q.to_string())
}

/// Whether `path` is `prefix` or lies under it: the prefix ends with `/`,
/// or `path` continues it with `/`.
pub fn path_extends(path: &str, prefix: &str) -> bool {
    if path == prefix {
        return true;
    }
    path.starts_with(prefix) && (prefix.ends_with('/') || path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Result<String, UrlError> {
        normalize(s).map(|u| u.to_string())
    }

    /// The words of a malformed URL's error, and that it is malformed (an
    /// invalid argument), not refused by policy.
    fn malformed_as(url: &str) -> String {
        match normalize(url) {
            Err(e @ UrlError::Malformed(_)) => e.to_string(),
            other => panic!("{url:?}: {other:?}"),
        }
    }

    #[test]
    fn each_malformed_part_is_named() {
        let long = format!("http://h/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(malformed_as(&long), format!("longer than {MAX_URL_LEN} bytes"));
        assert!(normalize(&long[..MAX_URL_LEN]).is_ok());
        assert_eq!(malformed_as("http://[::1]x/"), "junk after the IPv6 host");
        assert_eq!(malformed_as("http://h:8x/"), "port \"8x\" is not a number");
        assert_eq!(malformed_as("http://h/?a=%zz"), "a '%' not followed by two hex digits");
        assert_eq!(malformed_as("http://h/?a=%4"), "a '%' not followed by two hex digits");
        assert_eq!(malformed_as("http://h/?a=%"), "a '%' not followed by two hex digits");
        assert_eq!(n("http://h/?a=%4f").unwrap(), "http://h/?a=%4f");
    }

    #[test]
    fn normal_forms() {
        assert_eq!(n("HTTP://Host.Example:80").unwrap(), "http://host.example/");
        assert_eq!(n("https://h:8443/a/./b/../c?x=1&y=%2f").unwrap(), "https://h:8443/a/c?x=1&y=%2f");
        assert_eq!(n("http://h/pub/%7e%41%2a%2A").unwrap(), "http://h/pub/~A%2A%2A");
        assert_eq!(n("http://h/a/..").unwrap(), "http://h/");
        assert_eq!(n("http://h/a/b/.").unwrap(), "http://h/a/b/");
        assert_eq!(n("http://h/../../x").unwrap(), "http://h/x");
        assert_eq!(n("http://h/a//b").unwrap(), "http://h/a//b");
        assert_eq!(n("http://h/file%2etxt").unwrap(), "http://h/file.txt");
        assert_eq!(n("http://[::1]:8080/x").unwrap(), "http://[::1]:8080/x");
        assert_eq!(n("http://10.0.0.1/").unwrap(), "http://10.0.0.1/");
    }

    #[test]
    fn ambiguous_urls_are_refused() {
        for u in [
            "http://h/pub/%2e%2e%2fprivate.txt",
            "http://h/pub/..%2fprivate.txt",
            "http://h/pub/..%2Fprivate.txt",
            "http://h/pub/..%5cprivate.txt",
            "http://h/pub/%2e%2e/private.txt",
            "http://h/pub/.%2E/private.txt",
            "http://h/pub/%2e/x",
            "http://h/pub\\..\\x",
            "http://u:p@h/",
            "http://@h/",
            "http://h:/",
            "http://h:080/",
            "http://h:0/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://127.0.0.01/",
            "http://127.1/",
            "http://h./",
            "http://[0:0::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://h/#f",
        ] {
            assert!(matches!(normalize(u), Err(UrlError::Refused(_))), "{u}: {:?}", normalize(u));
        }
        for u in [
            "http://h/%zz",
            "http://h/%2",
            "http://h/a b",
            "http://h/<x>",
            "http://h/\u{e9}",
            "ftp://h/",
            "h/x",
            "http://",
            "http://h:99999/",
            "http://h_x/",
            "http://h/?a\"b",
        ] {
            assert!(matches!(normalize(u), Err(UrlError::Malformed(_))), "{u}: {:?}", normalize(u));
        }
    }

    #[test]
    fn prefixes() {
        assert!(path_extends("/v1", "/v1"));
        assert!(path_extends("/v1/x", "/v1"));
        assert!(!path_extends("/v10", "/v1"));
        assert!(path_extends("/pub/x", "/pub/"));
        assert!(!path_extends("/pub", "/pub/"));
    }
}
