//! Counting a JSON text's values before it is parsed. A parsed
//! `serde_json::Value` costs far more than its text (`[{"a":0},…]` takes
//! about 100 bytes of heap per byte), so a reader that builds a tree from
//! text a peer controls counts the values first, in one pass that
//! allocates nothing, and refuses a text past its limit.

/// Whether `text` holds more than `max` values: one, plus one for each
/// array or object opened and each `,` between elements, outside strings.
/// An upper bound for valid JSON (a key and its value count once), and
/// enough for any text serde_json would go on to build from.
pub fn over(text: &[u8], max: usize) -> bool {
    let mut count = 1usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' | b',' => {
                count += 1;
                if count > max {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}
