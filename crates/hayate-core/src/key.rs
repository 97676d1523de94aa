//! Keys and key expressions.
//!
//! A [`Key`] is a `/`-separated UTF-8 name such as `sensors/room1/temp`: no empty segments
//! (so no leading, trailing or doubled `/`), and no segment that is exactly `*` or `**`.
//! A [`KeyExpr`] is what a subscription selects: like a key, but a segment may be `*`
//! (exactly one segment) or `**` (zero or more segments). Other uses of `*` inside a segment
//! (`a*b`) are rejected in expressions and are ordinary characters in keys.

use std::fmt;

use bytes::Bytes;

/// The longest key or key expression, in bytes (it must fit a 16-bit length on the wire).
pub const MAX_KEY_LEN: usize = u16::MAX as usize;

/// Why a key or key expression was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty.
    #[error("key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("key is longer than {MAX_KEY_LEN} bytes")]
    TooLong,
    /// The key is not valid UTF-8.
    #[error("key is not valid UTF-8")]
    NotUtf8,
    /// The key has an empty segment (leading, trailing or doubled `/`).
    #[error("key has an empty segment")]
    EmptySegment,
    /// A concrete key contains a wildcard segment.
    #[error("a key may not contain the wildcard segment `{0}`")]
    Wildcard(&'static str),
    /// A key expression has `*` inside a segment (`a*b`).
    #[error("`*` may only be a whole segment (`*` or `**`) in a key expression")]
    PartialWildcard,
    /// The key has a control character (U+0000 to U+001F, U+007F): some protocol could not
    /// carry it intact (a NUL ends a STOMP frame, a line feed a header).
    #[error("key has a control character (byte 0x{0:02x})")]
    Control(u8),
}

fn check_common(b: &[u8]) -> Result<&str, KeyError> {
    if b.is_empty() {
        return Err(KeyError::Empty);
    }
    if b.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong);
    }
    let s = std::str::from_utf8(b).map_err(|_| KeyError::NotUtf8)?;
    // One pass over the bytes (a split per key costs more than the rest of a publish's
    // validation): an empty segment is a `/` first, last or after another `/`.
    let mut prev = b'/';
    for &c in b {
        if c == b'/' && prev == b'/' {
            return Err(KeyError::EmptySegment);
        }
        if c < 0x20 || c == 0x7f {
            return Err(KeyError::Control(c));
        }
        prev = c;
    }
    if prev == b'/' {
        return Err(KeyError::EmptySegment);
    }
    Ok(s)
}

/// True for a valid key of the common kind, checked in two branch-free passes that the
/// compiler vectorises: no control character, no `*`, no empty segment, and ASCII or else
/// valid UTF-8 (the standard library's check, itself fast on valid text). Anything else (a
/// `*`, or an error to name) takes the full checks. One key is validated per message
/// received, and the full checks cost several times more.
fn plain_key(b: &[u8]) -> bool {
    let (Some(&first), Some(&last)) = (b.first(), b.last()) else {
        return false;
    };
    if b.len() > MAX_KEY_LEN {
        return false;
    }
    let mut high = 0u8;
    let mut special = 0u8;
    for &c in b {
        high |= c;
        special |= u8::from(c < 0x20) | u8::from(c == 0x7f) | u8::from(c == b'*');
    }
    let mut double = 0u8;
    for (&x, &y) in b.iter().zip(&b[1..]) {
        double |= u8::from(x == b'/') & u8::from(y == b'/');
    }
    special == 0
        && double == 0
        && first != b'/'
        && last != b'/'
        && (high < 0x80 || std::str::from_utf8(b).is_ok())
}

/// The checks of a key that [`plain_key`] did not admit, naming what is wrong.
fn full_check(b: &[u8]) -> Result<(), KeyError> {
    check_common(b)?;
    match wildcard_segment(b) {
        Some(w) => Err(KeyError::Wildcard(w)),
        None => Ok(()),
    }
}

/// The wildcard segment (`*` or `**`) of a key with no empty segment, if it has one.
fn wildcard_segment(b: &[u8]) -> Option<&'static str> {
    if !b.contains(&b'*') {
        return None;
    }
    b.split(|&c| c == b'/').find_map(|seg| match seg {
        b"*" => Some("*"),
        b"**" => Some("**"),
        _ => None,
    })
}

/// A concrete key, validated on construction. Cheap to clone (reference-counted bytes).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Bytes);

impl Key {
    /// Validates `bytes` as a key without copying them. This and [`Key::new`] (with
    /// [`Key::from_bytes_or_return`]) are the only ways to make a key: every key is one the
    /// checks admit (there is no unchecked constructor).
    pub fn from_bytes(bytes: Bytes) -> Result<Key, KeyError> {
        if !plain_key(&bytes) {
            full_check(&bytes)?;
        }
        Ok(Key(bytes))
    }

    /// [`Key::from_bytes`] that gives the bytes back with the reason they are no key, for a
    /// caller that then maps or reports them (an MQTT topic with an empty level) without
    /// keeping a second reference to them.
    pub fn from_bytes_or_return(bytes: Bytes) -> Result<Key, (KeyError, Bytes)> {
        if !plain_key(&bytes)
            && let Err(e) = full_check(&bytes)
        {
            return Err((e, bytes));
        }
        Ok(Key(bytes))
    }

    /// Validates a string as a key.
    pub fn new(s: &str) -> Result<Key, KeyError> {
        Key::from_bytes(Bytes::copy_from_slice(s.as_bytes()))
    }

    /// The key as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The same key in an allocation of its own. A key decoded from a connection's input
    /// shares that read buffer (64 KiB and more); whatever keeps a key long after the
    /// message (a route cache, a retained message, an offline session) keeps this copy, so
    /// it does not pin the whole buffer.
    pub fn compact(&self) -> Key {
        Key(Bytes::copy_from_slice(&self.0))
    }

    /// The key as shared bytes.
    pub fn as_shared(&self) -> &Bytes {
        &self.0
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        // Validated as UTF-8 on construction.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// The segments of the key.
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|&b| b == b'/')
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", self.as_str())
    }
}

impl std::str::FromStr for Key {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Key, KeyError> {
        Key::new(s)
    }
}

/// One segment of a key expression.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Segment {
    /// Matches exactly this segment.
    Literal(Box<[u8]>),
    /// `*`: matches exactly one segment.
    Star,
    /// `**`: matches zero or more segments.
    DoubleStar,
}

/// A key expression, validated on construction.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyExpr {
    text: Box<str>,
    segments: Box<[Segment]>,
}

impl KeyExpr {
    /// Parses a key expression.
    pub fn new(s: &str) -> Result<KeyExpr, KeyError> {
        Self::from_bytes(s.as_bytes())
    }

    /// Parses a key expression from bytes.
    pub fn from_bytes(b: &[u8]) -> Result<KeyExpr, KeyError> {
        let s = check_common(b)?;
        let mut segments = Vec::new();
        for seg in s.split('/') {
            segments.push(match seg {
                "*" => Segment::Star,
                "**" => {
                    // `**/**` is the same as `**`: keep one, which also bounds matching work.
                    if segments.last() == Some(&Segment::DoubleStar) {
                        continue;
                    }
                    Segment::DoubleStar
                }
                _ if seg.contains('*') => return Err(KeyError::PartialWildcard),
                _ => Segment::Literal(seg.as_bytes().into()),
            });
        }
        Ok(KeyExpr {
            text: s.into(),
            segments: segments.into(),
        })
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The parsed segments.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// True if the expression has no wildcard: it selects exactly one key.
    pub fn is_literal(&self) -> bool {
        self.segments
            .iter()
            .all(|s| matches!(s, Segment::Literal(_)))
    }

    /// Does every key that `other` selects match this expression too? (`a/**` includes
    /// `a/*/c`; `a/*` does not include `a/**`.) Exact for expressions of up to 63 segments;
    /// beyond, `false` (the safe answer for a permission check: not covered).
    pub fn includes(&self, other: &KeyExpr) -> bool {
        walk(&self.segments, &other.segments, true).unwrap_or(false)
    }

    /// Is there a key that both expressions select? Exact for expressions of up to 63
    /// segments; beyond, `true` (the safe answer for a permission check: may overlap).
    pub fn intersects(&self, other: &KeyExpr) -> bool {
        walk(&self.segments, &other.segments, false).unwrap_or(true)
    }

    /// Does this expression select `key`?
    pub fn matches(&self, key: &Key) -> bool {
        let segs: Vec<&[u8]> = key.segments().collect();
        match_segments(&self.segments, &segs)
    }
}

/// The states of a pattern's automaton reachable from `set` without reading a segment
/// (a `**` may match none): bit `i` = "matched the first `i` segments of the pattern".
fn closure(p: &[Segment], mut set: u64) -> u64 {
    for (i, seg) in p.iter().enumerate() {
        if set & (1 << i) != 0 && *seg == Segment::DoubleStar {
            set |= 1 << (i + 1);
        }
    }
    set
}

/// The states after reading one segment `sym` (`None`: a segment no literal names).
fn step(p: &[Segment], set: u64, sym: Option<&[u8]>) -> u64 {
    let mut next = 0u64;
    for (i, seg) in p.iter().enumerate() {
        if set & (1 << i) == 0 {
            continue;
        }
        match seg {
            Segment::DoubleStar => next |= 1 << i,
            Segment::Star => next |= 1 << (i + 1),
            Segment::Literal(l) if Some(&**l) == sym => next |= 1 << (i + 1),
            Segment::Literal(_) => {}
        }
    }
    closure(p, next)
}

/// Inclusion (`a` selects every key `b` selects) or intersection, by walking both patterns'
/// automata over every segment either names plus one neither does (all other segments
/// behave alike), keys of one or more segments only. `None` when a pattern is too long
/// for the 64-bit state sets.
fn walk(a: &[Segment], b: &[Segment], include: bool) -> Option<bool> {
    if a.len() >= 63 || b.len() >= 63 {
        return None;
    }
    let mut syms: Vec<Option<&[u8]>> = vec![None];
    for seg in a.iter().chain(b) {
        if let Segment::Literal(l) = seg
            && !syms.contains(&Some(&**l))
        {
            syms.push(Some(l));
        }
    }
    let (fa, fb) = (1u64 << a.len(), 1u64 << b.len());
    let start = (closure(a, 1), closure(b, 1));
    let mut seen = std::collections::HashSet::new();
    let mut todo = Vec::new();
    // States after at least one segment (a key is never empty).
    for &sym in &syms {
        let s = (step(a, start.0, sym), step(b, start.1, sym));
        if seen.insert(s) {
            todo.push(s);
        }
    }
    while let Some((sa, sb)) = todo.pop() {
        let (acc_a, acc_b) = (sa & fa != 0, sb & fb != 0);
        if include && acc_b && !acc_a {
            return Some(false);
        }
        if !include && acc_a && acc_b {
            return Some(true);
        }
        if sb == 0 || (!include && sa == 0) {
            continue;
        }
        for &sym in &syms {
            let s = (step(a, sa, sym), step(b, sb, sym));
            if seen.insert(s) {
                todo.push(s);
            }
        }
    }
    Some(include)
}

/// Glob matching over segments, with backtracking to the last `**` only (linear for the
/// common cases, never exponential: `**` runs are collapsed at parse time).
pub fn match_segments(pat: &[Segment], key: &[&[u8]]) -> bool {
    let (mut p, mut k) = (0usize, 0usize);
    let mut resume: Option<(usize, usize)> = None;
    while k < key.len() {
        match pat.get(p) {
            Some(Segment::DoubleStar) => {
                resume = Some((p, k));
                p += 1;
                continue;
            }
            Some(Segment::Star) => {
                p += 1;
                k += 1;
                continue;
            }
            Some(Segment::Literal(l)) if **l == *key[k] => {
                p += 1;
                k += 1;
                continue;
            }
            _ => {}
        }
        match resume {
            Some((rp, rk)) => {
                // Let the last `**` swallow one more segment and retry.
                resume = Some((rp, rk + 1));
                p = rp + 1;
                k = rk + 1;
            }
            None => return false,
        }
    }
    pat[p..].iter().all(|s| *s == Segment::DoubleStar)
}

impl fmt::Display for KeyExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for KeyExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyExpr({:?})", &*self.text)
    }
}

impl std::str::FromStr for KeyExpr {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<KeyExpr, KeyError> {
        KeyExpr::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn m(expr: &str, key: &str) -> bool {
        KeyExpr::new(expr).unwrap().matches(&Key::new(key).unwrap())
    }

    #[test]
    fn examples() {
        assert!(m("a/b", "a/b"));
        assert!(!m("a/b", "a/c"));
        assert!(m("a/*", "a/b"));
        assert!(!m("a/*", "a/b/c"));
        assert!(!m("a/*", "a"));
        assert!(m("a/**", "a"));
        assert!(m("a/**", "a/b/c"));
        assert!(m("**", "x/y"));
        assert!(m("**/c", "c"));
        assert!(m("a/**/c", "a/c"));
        assert!(m("a/**/c", "a/b/b/c"));
        assert!(!m("a/**/c", "a/b/b/d"));
        assert!(m("a/**/b/*", "a/x/b/b/y"));
        assert!(m("*/**/*", "a/b"));
        assert!(!m("*/**/*", "a"));
    }

    #[test]
    fn validation() {
        assert_eq!(Key::new(""), Err(KeyError::Empty));
        assert_eq!(Key::new("/a"), Err(KeyError::EmptySegment));
        assert_eq!(Key::new("a/"), Err(KeyError::EmptySegment));
        assert_eq!(Key::new("a//b"), Err(KeyError::EmptySegment));
        assert_eq!(Key::new("a/*"), Err(KeyError::Wildcard("*")));
        assert_eq!(Key::new("a/**/b"), Err(KeyError::Wildcard("**")));
        assert!(Key::new("a/b*c").is_ok());
        assert_eq!(
            Key::from_bytes(Bytes::from_static(b"\xff")),
            Err(KeyError::NotUtf8)
        );
        assert_eq!(KeyExpr::new("a/b*"), Err(KeyError::PartialWildcard));
        assert_eq!(KeyExpr::new("a/**/**/b").unwrap().segments().len(), 3);
        assert_eq!(
            Key::new(&"a".repeat(MAX_KEY_LEN + 1)),
            Err(KeyError::TooLong)
        );
    }

    /// The naive reference: plain recursion over both lists.
    fn naive(pat: &[Segment], key: &[&[u8]]) -> bool {
        match pat.split_first() {
            None => key.is_empty(),
            Some((Segment::DoubleStar, rest)) => (0..=key.len()).any(|i| naive(rest, &key[i..])),
            Some((Segment::Star, rest)) => !key.is_empty() && naive(rest, &key[1..]),
            Some((Segment::Literal(l), rest)) => {
                !key.is_empty() && **l == *key[0] && naive(rest, &key[1..])
            }
        }
    }

    fn seg() -> impl Strategy<Value = String> {
        prop_oneof!["a", "b", "c", "ab"].prop_map(String::from)
    }
    fn pat_seg() -> impl Strategy<Value = String> {
        prop_oneof![3 => seg(), 1 => Just("*".to_string()), 1 => Just("**".to_string())]
    }

    /// The reference validation of a key, segment by segment.
    fn naive_key(s: &str) -> Result<(), KeyError> {
        if s.is_empty() {
            return Err(KeyError::Empty);
        }
        if s.split('/').any(str::is_empty) {
            return Err(KeyError::EmptySegment);
        }
        for seg in s.split('/') {
            match seg {
                "*" => return Err(KeyError::Wildcard("*")),
                "**" => return Err(KeyError::Wildcard("**")),
                _ => {}
            }
        }
        Ok(())
    }

    /// Every key of up to 5 segments over the literals the patterns use plus a fresh one.
    fn witnesses() -> Vec<Key> {
        let alpha = ["a", "b", "c", "ab", "q"];
        let mut out = Vec::new();
        let mut cur: Vec<Vec<&str>> = vec![vec![]];
        for _ in 0..5 {
            let mut next = Vec::new();
            for k in &cur {
                for a in alpha {
                    let mut k2 = k.clone();
                    k2.push(a);
                    out.push(Key::new(&k2.join("/")).unwrap());
                    next.push(k2);
                }
            }
            cur = next;
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn includes_and_intersects_agree_with_the_keys(
            a in proptest::collection::vec(pat_seg(), 1..4),
            b in proptest::collection::vec(pat_seg(), 1..4),
        ) {
            let (a, b) = (KeyExpr::new(&a.join("/")).unwrap(), KeyExpr::new(&b.join("/")).unwrap());
            let keys = witnesses();
            let both = keys.iter().any(|k| a.matches(k) && b.matches(k));
            let covered = keys.iter().all(|k| !b.matches(k) || a.matches(k));
            prop_assert_eq!(a.intersects(&b), both, "{} ∩ {}", a, b);
            prop_assert_eq!(a.includes(&b), covered, "{} ⊇ {}", a, b);
        }
    }

    proptest! {
        #[test]
        fn key_validation_like_naive(s in "[a/*é\u{0}\u{1f}\u{7f}]{0,12}") {
            if s.bytes().any(|c| c < 0x20 || c == 0x7f) {
                prop_assert!(Key::new(&s).is_err(), "{:?}", s);
                prop_assert!(KeyExpr::new(&s).is_err(), "{:?}", s);
            } else {
                prop_assert_eq!(Key::new(&s).map(|_| ()), naive_key(&s));
            }
        }

        #[test]
        fn matches_like_naive(
            pat in proptest::collection::vec(pat_seg(), 1..7),
            key in proptest::collection::vec(seg(), 1..8),
        ) {
            let expr = KeyExpr::new(&pat.join("/")).unwrap();
            let key = Key::new(&key.join("/")).unwrap();
            let segs: Vec<&[u8]> = key.segments().collect();
            prop_assert_eq!(expr.matches(&key), naive(expr.segments(), &segs));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = KeyExpr::from_bytes(&b);
            let _ = Key::from_bytes(Bytes::from(b));
        }

        /// The fast path accepts only what the full checks accept (bytes drawn mostly from
        /// the characters that matter: `/`, `*`, controls, DEL, non-ASCII).
        #[test]
        fn the_fast_path_agrees_with_the_full_checks(
            b in proptest::collection::vec(
                prop_oneof![
                    Just(b'/'), Just(b'*'), Just(b'a'), Just(0u8), Just(0x1f), Just(0x7f),
                    Just(0x80), Just(0xc3), Just(0xa9), any::<u8>()
                ],
                0..24,
            )
        ) {
            let full = check_common(&b).is_ok() && wildcard_segment(&b).is_none();
            if plain_key(&b) {
                prop_assert!(full, "fast path accepted {b:?}");
            }
            prop_assert_eq!(Key::from_bytes(Bytes::from(b.clone())).is_ok(), full);
            let ascii = b.iter().all(|c| (0x20..0x7f).contains(c) && *c != b'*');
            if full && ascii {
                prop_assert!(plain_key(&b), "fast path missed {b:?}");
            }
        }
    }
}
