//! The VFS URL check against its oracles (`support/url_oracle.rs`): URLs
//! built from the pieces that have fooled prefix checks (encoded dots and
//! separators, backslashes, userinfo, odd ports and hosts), each allowed
//! one read the same by the `url` crate and by a decoding server.

#[path = "support/url_oracle.rs"]
mod url_oracle;

use proptest::prelude::*;
use url_oracle::{check, check_url, policy, server_view};

fn piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "pub",
        "api",
        "a",
        "b",
        "x",
        "..",
        ".",
        "",
        "%2e",
        "%2E",
        "%2e%2e",
        ".%2e",
        "%2f",
        "%2F",
        "%5c",
        "%5C",
        "..%2f",
        "%41",
        "%7e",
        "%7E",
        "%25",
        "%252e",
        "%2a",
        "%2A",
        "a%2a",
        "\\",
        "#f",
        "?q=1",
        "@",
        ":",
        ";x=1",
        "private.txt",
        "~u",
        "%zz",
        "%",
        "a b",
        "é",
    ])
}

fn authority() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "h.example",
        "H.EXAMPLE",
        "h.example:80",
        "h.example:080",
        "h.example:",
        "u@h.example",
        "h.example.",
        "h.example:8443",
        "127.0.0.1:8080",
        "127.1:8080",
        "2130706433:8080",
        "0x7f.0.0.1:8080",
        "[::1]",
        "[0:0::1]",
        "[::1]:80",
        "evil.example",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn whatever_is_allowed_stays_under_its_prefix(
        scheme in prop::sample::select(vec!["http", "https", "HTTP", "ftp"]),
        auth in authority(),
        pieces in prop::collection::vec(piece(), 0..7),
    ) {
        let url = format!("{scheme}://{auth}/{}", pieces.join("/"));
        check_url(&policy(), &url);
    }
}

#[test]
fn the_oracles_see_what_the_attacks_aim_at() {
    let p = policy();
    for ok in [
        "http://h.example/pub/x",
        "HTTP://H.example:80/pub/a/../b",
        "http://h.example/pub/%66ile%2a?x=%2f",
        "https://h.example:8443/a/b/./c",
        "http://[::1]/x/y",
        "http://127.0.0.1:8080/anything",
    ] {
        assert!(p.check_url(ok).is_ok(), "{ok}");
        check_url(&p, ok);
    }
    for bad in [
        "http://h.example/pub/%2e%2e%2fprivate.txt",
        "http://h.example/pub/..%2fprivate.txt",
        "http://h.example/pub/..%5cprivate.txt",
        "http://h.example/pub/..\\private.txt",
        "http://h.example/pub/../private.txt",
        "http://h.example/apix",
        "http://h.example:8080/pub/",
        "http://[0:0::1]/x/",
    ] {
        assert!(p.check_url(bad).is_err(), "{bad}");
    }
    // The fuzz target's entry point reads the input as the URL.
    check(b"http://h.example/pub/a/../b");
    check(b"http://h.example/pub/\xff");
    // The server model decodes what the url crate leaves alone.
    assert_eq!(server_view("/pub/%2e%2e%2fprivate.txt"), "/private.txt");
    assert_eq!(url::Url::parse("http://h/pub/..%2fprivate.txt").unwrap().path(), "/pub/..%2fprivate.txt");
}
