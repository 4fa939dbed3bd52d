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
