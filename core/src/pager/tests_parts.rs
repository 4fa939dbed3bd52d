//! The pager's parts on their own, beside the machine's tests in
//! `tests.rs`. Many are here because a mutant of the part's code went
//! unnoticed otherwise (docs/verification.md).

use super::error::{echo, MAX_ECHO};

#[test]
fn an_echo_is_cut_at_max_echo_on_a_character_boundary() {
    let exact = "x".repeat(MAX_ECHO);
    assert_eq!(echo(&exact), exact);
    let long = "y".repeat(MAX_ECHO + 40);
    assert_eq!(echo(&long), format!("{}…", &long[..MAX_ECHO]));
    // 'a' then two-byte characters: byte MAX_ECHO (even) falls inside one.
    let wide = format!("a{}", "é".repeat(MAX_ECHO));
    let cut = echo(&wide);
    assert_eq!(cut, format!("a{}…", "é".repeat((MAX_ECHO - 2) / 2)));
    assert_eq!(cut.len(), MAX_ECHO - 1 + "…".len());
}

#[test]
fn a_size_whose_frames_just_fit_max_frame_is_accepted() {
    use super::PagerConfig;
    // 3 characters: up to 12 bytes, 16 of base64, plus 1,024 of framing.
    let c = PagerConfig {
        max_direct_output_chars: 3,
        max_input_chars: 3,
        default_page_size: 3,
        ..PagerConfig::default()
    };
    assert_eq!(c.validate(1040), Ok(vec![]));
    let e = c.validate(1039).unwrap_err();
    assert_eq!(
        e,
        "file_descriptor.max_direct_output_chars = 3: content that size needs frames of 1040 bytes, over --max-frame 1039"
    );
    let warned = PagerConfig { default_page_size: 4, ..c };
    assert_eq!(warned.validate(1040).unwrap().len(), 1);
}
