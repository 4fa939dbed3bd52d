//! `[file_descriptor]` in `--config`: the session's fd pager (seed 003),
//! with the seed's names and defaults, and `max_total_bytes`.
//!
//! ```toml
//! [file_descriptor]
//! enabled = true
//! max_direct_output_chars = 8000
//! default_page_size = 4000
//! max_input_chars = 8000
//! page_user_input = true
//! max_total_bytes = 1073741824
//! ```

use airlock_core::pager::{
    PagerConfig, DEFAULT_MAX_DIRECT_OUTPUT_CHARS, DEFAULT_MAX_INPUT_CHARS, DEFAULT_MAX_TOTAL_BYTES,
    DEFAULT_PAGE_SIZE,
};
use anyhow::bail;
use serde::Deserialize;

/// `[file_descriptor]`, as written. Sizes are read as signed so that a
/// negative one is refused by name rather than as a type error.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FdSection {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "max_direct")]
    pub max_direct_output_chars: i64,
    #[serde(default = "page_size")]
    pub default_page_size: i64,
    #[serde(default = "max_input")]
    pub max_input_chars: i64,
    #[serde(default = "yes")]
    pub page_user_input: bool,
    #[serde(default = "max_total")]
    pub max_total_bytes: i64,
}

fn yes() -> bool {
    true
}
fn max_direct() -> i64 {
    DEFAULT_MAX_DIRECT_OUTPUT_CHARS as i64
}
fn page_size() -> i64 {
    DEFAULT_PAGE_SIZE as i64
}
fn max_input() -> i64 {
    DEFAULT_MAX_INPUT_CHARS as i64
}
fn max_total() -> i64 {
    DEFAULT_MAX_TOTAL_BYTES as i64
}

fn positive(key: &str, v: i64) -> anyhow::Result<u64> {
    match u64::try_from(v) {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("file_descriptor.{key} = {v}: want a positive number"),
    }
}

impl FdSection {
    /// The pager's config; `None` when `enabled = false`.
    pub fn resolve(self) -> anyhow::Result<Option<PagerConfig>> {
        let config = PagerConfig {
            max_direct_output_chars: positive("max_direct_output_chars", self.max_direct_output_chars)?,
            default_page_size: positive("default_page_size", self.default_page_size)?,
            max_input_chars: positive("max_input_chars", self.max_input_chars)?,
            page_user_input: self.page_user_input,
            max_total_bytes: positive("max_total_bytes", self.max_total_bytes)?,
        };
        Ok(self.enabled.then_some(config))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse;
    use airlock_core::pager::PagerConfig;
    use std::path::Path;

    fn err(text: &str) -> String {
        format!("{:#}", parse(text, Path::new("/cfg")).expect_err("refused"))
    }

    #[test]
    fn the_seed_s_defaults() {
        let s = parse("[file_descriptor]\n", Path::new("/")).unwrap();
        assert_eq!(s.pager, Some(PagerConfig::default()));
        let s = parse("[file_descriptor]\nenabled = false\n", Path::new("/")).unwrap();
        assert_eq!(s.pager, None);
        assert_eq!(parse("", Path::new("/")).unwrap().pager, None);
    }

    #[test]
    fn every_key_is_read() {
        let s = parse(
            "[file_descriptor]\nenabled = true\nmax_direct_output_chars = 10\ndefault_page_size = 5\nmax_input_chars = 7\npage_user_input = false\nmax_total_bytes = 99\n",
            Path::new("/"),
        )
        .unwrap();
        let want = PagerConfig {
            max_direct_output_chars: 10,
            default_page_size: 5,
            max_input_chars: 7,
            page_user_input: false,
            max_total_bytes: 99,
        };
        assert_eq!(s.pager, Some(want));
    }

    #[test]
    fn bad_keys_and_sizes_are_named() {
        let e = err("[file_descriptor]\npage_size = 3\n");
        assert!(e.contains("page_size"), "{e}");
        let e = err("[file_descriptor]\ndefault_page_size = 0\n");
        assert!(e.contains("file_descriptor.default_page_size = 0"), "{e}");
        let e = err("[file_descriptor]\nmax_total_bytes = -5\n");
        assert!(e.contains("file_descriptor.max_total_bytes = -5"), "{e}");
        let e = err("[file_descriptor]\nmax_input_chars = \"many\"\n");
        assert!(e.contains("max_input_chars"), "{e}");
    }
}
