//! Finding a byte pattern in a stream that arrives in pieces.

/// Looks for one pattern in a stream fed piece by piece, including a match split across pieces.
#[derive(Debug)]
pub struct Matcher {
    pattern: Vec<u8>,
    /// The last `pattern.len() - 1` bytes seen: the start of a match the next piece may end.
    tail: Vec<u8>,
}

impl Matcher {
    /// A matcher for `pattern`; an empty pattern matches the first piece.
    pub fn new(pattern: &[u8]) -> Self {
        Self {
            pattern: pattern.to_vec(),
            tail: Vec::new(),
        }
    }

    /// The pattern looked for.
    pub fn pattern(&self) -> &[u8] {
        &self.pattern
    }

    /// Feeds the next piece; whether a match ends in it.
    pub fn feed(&mut self, piece: &[u8]) -> bool {
        self.find(piece).is_some()
    }

    /// Feeds the next piece; where in it the first match that ends in it starts (0 when it
    /// began in an earlier piece, or for an empty pattern), if any.
    pub fn find(&mut self, piece: &[u8]) -> Option<usize> {
        if self.pattern.is_empty() {
            return Some(0);
        }
        let mut window = std::mem::take(&mut self.tail);
        let carried = window.len();
        window.extend_from_slice(piece);
        let found = window
            .windows(self.pattern.len())
            .position(|w| w == self.pattern.as_slice())
            .map(|start| start.saturating_sub(carried));
        let keep = self.pattern.len() - 1;
        self.tail = window[window.len().saturating_sub(keep)..].to_vec();
        found
    }
}

#[test]
fn a_match_split_across_pieces_is_found() {
    let mut m = Matcher::new(b"COMMIT");
    assert!(!m.feed(b"xxCOM"));
    assert!(m.feed(b"MITyy"));
    let mut m = Matcher::new(b"abc");
    assert!(!m.feed(b"a"));
    assert!(!m.feed(b"b"));
    assert!(m.feed(b"c"));
    assert!(!Matcher::new(b"abc").feed(b"acb"));
}

#[test]
fn a_match_says_where_it_starts_in_the_piece() {
    let mut m = Matcher::new(b"COMMIT");
    assert_eq!(m.find(b"xx"), None);
    assert_eq!(m.find(b"yyCOMMITzz"), Some(2));
    let mut m = Matcher::new(b"COMMIT");
    assert_eq!(m.find(b"xxCOM"), None);
    assert_eq!(m.find(b"MITyy"), Some(0), "begun in the piece before");
}
