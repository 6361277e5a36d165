//! The order-preserving key encoding of map, multimap and set keys.
//!
//! The host compares keys as bytes (PostgreSQL `bytea` order), so a key's
//! encoding must sort exactly like the key: for any `a` and `b`,
//! `a.cmp(&b) == encode_key(&a).cmp(&encode_key(&b))`. Encodings are also
//! prefix-free (no encoding is a prefix of another), which is what lets
//! tuples concatenate their parts and multimaps append a suffix to a key.
//!
//! | type | encoding |
//! | --- | --- |
//! | `u8`..`u64` | big-endian |
//! | `i8`..`i64` | big-endian with the sign bit flipped |
//! | `bool` | one byte, 0 or 1 |
//! | `String`, `str`, `Vec<u8>`, `[u8]` | bytes with 0x00 escaped as 0x00 0xFF, then 0x00 0x01 |
//! | `Option<T>` | 0x00 for `None`, 0x01 then `T` for `Some` |
//! | tuples up to 4 | concatenation |
//! | `XRef` object references | as their `i64` id |

use std::fmt;

/// A value usable as a key: encodes so that byte order is the value's order.
///
/// Implement it for your own type by encoding into an existing key type, for
/// example a tuple of its parts (and [`OwnedKey`] to decode it back).
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::key::{encode_key, Key};
///
/// assert!(encode_key(&-1i64) < encode_key(&0i64));
/// assert!(encode_key("apple") < encode_key("apples"));
/// assert!(encode_key(&(1u32, "b")) < encode_key(&(2u32, "a")));
/// ```
pub trait Key {
    /// Appends the encoding of `self` to `out`.
    fn encode(&self, out: &mut Vec<u8>);
}

/// A key that can be decoded back from its encoding (what maps need to
/// return their keys).
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::key::{decode_key, encode_key};
///
/// let bytes = encode_key(&(7u64, String::from("x\0y")));
/// let back: (u64, String) = decode_key(&bytes).unwrap();
/// assert_eq!(back, (7, "x\0y".to_string()));
/// ```
pub trait OwnedKey: Key + Sized {
    /// Decodes one key from the front of `input` and advances `input` past it.
    fn decode(input: &mut &[u8]) -> Result<Self, KeyError>;
}

/// A stored key that does not decode as the expected key type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed key: {0}")]
pub struct KeyError(String);

impl KeyError {
    fn new(msg: impl fmt::Display) -> Self {
        KeyError(msg.to_string())
    }
}

/// The encoding of `key`.
pub fn encode_key<K: Key + ?Sized>(key: &K) -> Vec<u8> {
    let mut out = Vec::new();
    key.encode(&mut out);
    out
}

/// Decodes `bytes`, which must hold exactly one key.
pub fn decode_key<K: OwnedKey>(mut bytes: &[u8]) -> Result<K, KeyError> {
    let key = K::decode(&mut bytes)?;
    if !bytes.is_empty() {
        return Err(KeyError::new(format_args!("{} trailing bytes", bytes.len())));
    }
    Ok(key)
}

/// The smallest byte string greater than every string starting with
/// `prefix`, or `None` if there is none (the prefix is all 0xFF).
pub(crate) fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], KeyError> {
    if input.len() < n {
        return Err(KeyError::new(format_args!("expected {n} bytes, found {}", input.len())));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

macro_rules! unsigned_key {
    ($($t:ty),*) => {$(
        impl Key for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_be_bytes());
            }
        }
        impl OwnedKey for $t {
            fn decode(input: &mut &[u8]) -> Result<Self, KeyError> {
                let bytes = take(input, std::mem::size_of::<$t>())?;
                Ok(<$t>::from_be_bytes(bytes.try_into().expect("length checked")))
            }
        }
    )*};
}
unsigned_key!(u8, u16, u32, u64);

// Flipping the sign bit maps i_MIN..=i_MAX onto 0..=u_MAX in order.
macro_rules! signed_key {
    ($($t:ty => $u:ty),*) => {$(
        impl Key for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                let flipped = (*self as $u) ^ (1 << (<$u>::BITS - 1));
                out.extend_from_slice(&flipped.to_be_bytes());
            }
        }
        impl OwnedKey for $t {
            fn decode(input: &mut &[u8]) -> Result<Self, KeyError> {
                let flipped = <$u as OwnedKey>::decode(input)?;
                Ok((flipped ^ (1 << (<$u>::BITS - 1))) as $t)
            }
        }
    )*};
}
signed_key!(i8 => u8, i16 => u16, i32 => u32, i64 => u64);

impl Key for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
}

impl OwnedKey for bool {
    fn decode(input: &mut &[u8]) -> Result<Self, KeyError> {
        match take(input, 1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(KeyError::new(format_args!("bool byte {b}"))),
        }
    }
}

// Escaping 0x00 as 0x00 0xFF and terminating with 0x00 0x01 keeps byte order
// (the terminator sorts below any continuation) and makes the encoding
// prefix-free.
fn encode_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0x00, 0x01]);
}

fn decode_bytes(input: &mut &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut bytes = Vec::new();
    let mut i = 0;
    loop {
        match input.get(i) {
            None => return Err(KeyError::new("unterminated string")),
            Some(0) => match input.get(i + 1) {
                Some(0xFF) => bytes.push(0),
                Some(0x01) => {
                    *input = &input[i + 2..];
                    return Ok(bytes);
                }
                _ => return Err(KeyError::new("bad escape in string")),
            },
            Some(&b) => {
                bytes.push(b);
                i += 1;
                continue;
            }
        }
        i += 2;
    }
}

impl Key for [u8] {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_bytes(self, out)
    }
}

impl Key for Vec<u8> {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_bytes(self, out)
    }
}

impl OwnedKey for Vec<u8> {
    fn decode(input: &mut &[u8]) -> Result<Self, KeyError> {
        decode_bytes(input)
    }
}

impl Key for str {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_bytes(self.as_bytes(), out)
    }
}

impl Key for String {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_bytes(self.as_bytes(), out)
    }
}

impl OwnedKey for String {
    fn decode(input: &mut &[u8]) -> Result<Self, KeyError> {
        String::from_utf8(decode_bytes(input)?).map_err(KeyError::new)
    }
}

impl<T: Key + ?Sized> Key for &T {
    fn encode(&self, out: &mut Vec<u8>) {
        (**self).encode(out)
    }
}

impl<T: Key> Key for Option<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.encode(out);
            }
        }
    }
}

impl<T: OwnedKey> OwnedKey for Option<T> {
    fn decode(input: &mut &[u8]) -> Result<Self, KeyError> {
        match take(input, 1)?[0] {
            0 => Ok(None),
            1 => Ok(Some(T::decode(input)?)),
            b => Err(KeyError::new(format_args!("option tag {b}"))),
        }
    }
}

macro_rules! tuple_key {
    ($($name:ident)+) => {
        impl<$($name: Key),+> Key for ($($name,)+) {
            #[allow(non_snake_case)]
            fn encode(&self, out: &mut Vec<u8>) {
                let ($($name,)+) = self;
                $($name.encode(out);)+
            }
        }
        impl<$($name: OwnedKey),+> OwnedKey for ($($name,)+) {
            fn decode(input: &mut &[u8]) -> Result<Self, KeyError> {
                Ok(($($name::decode(input)?,)+))
            }
        }
    };
}
tuple_key!(A);
tuple_key!(A B);
tuple_key!(A B C);
tuple_key!(A B C D);

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Debug;

    /// SplitMix64: deterministic, so a failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Integers biased toward the edges, where sign and width bugs live.
        fn int(&mut self) -> u64 {
            match self.next() % 4 {
                0 => self.next() % 4,
                1 => u64::MAX - self.next() % 4,
                2 => (1 << 63) ^ (self.next() % 4),
                _ => self.next(),
            }
        }

        /// Short byte strings over a tiny alphabet full of 0x00, 0x01 and
        /// 0xFF, so escapes, terminators and shared prefixes are common.
        fn bytes(&mut self) -> Vec<u8> {
            let len = self.next() % 6;
            (0..len).map(|_| [0x00, 0x01, 0x02, 0x61, 0xFE, 0xFF][(self.next() % 6) as usize]).collect()
        }

        fn string(&mut self) -> String {
            let len = self.next() % 5;
            (0..len).map(|_| ['\0', '\u{1}', 'a', 'b', 'é', '\u{10FFFF}'][(self.next() % 6) as usize]).collect()
        }
    }

    /// Checks order preservation, round trip and prefix-freedom on every
    /// pair of `n` generated values.
    fn check<K: OwnedKey + Ord + Debug>(n: usize, mut gen: impl FnMut(&mut Rng) -> K) {
        let mut rng = Rng(0x5EED);
        let values: Vec<K> = (0..n).map(|_| gen(&mut rng)).collect();
        let encoded: Vec<Vec<u8>> = values.iter().map(encode_key).collect();
        for (v, e) in values.iter().zip(&encoded) {
            assert_eq!(&decode_key::<K>(e).unwrap(), v, "round trip of {v:?}");
        }
        for (a, ea) in values.iter().zip(&encoded) {
            for (b, eb) in values.iter().zip(&encoded) {
                assert_eq!(a.cmp(b), ea.cmp(eb), "order of {a:?} and {b:?}");
                if a != b {
                    assert!(!eb.starts_with(ea), "{a:?} encodes to a prefix of {b:?}");
                }
            }
        }
    }

    #[test]
    fn unsigned_integers() {
        check(200, |r| r.int() as u8);
        check(200, |r| r.int() as u16);
        check(200, |r| r.int() as u32);
        check(200, |r| r.int());
    }

    #[test]
    fn signed_integers() {
        check(200, |r| r.int() as i8);
        check(200, |r| r.int() as i16);
        check(200, |r| r.int() as i32);
        check(200, |r| r.int() as i64);
    }

    #[test]
    fn booleans_and_options() {
        check(20, |r| r.next() % 2 == 0);
        check(200, |r| (r.next() % 3 != 0).then(|| r.int() as i32));
    }

    #[test]
    fn strings_and_bytes() {
        check(300, |r| r.string());
        check(300, |r| r.bytes());
    }

    #[test]
    fn tuples() {
        check(200, |r| (r.int() as i16,));
        check(300, |r| (r.bytes(), r.int() as u8));
        check(300, |r| (r.string(), r.bytes(), r.next() % 2 == 0));
        check(300, |r| (r.int() as i8, r.string(), r.int() as u16, r.bytes()));
    }

    #[test]
    fn borrowed_forms_encode_like_owned_ones() {
        assert_eq!(encode_key("a\0b"), encode_key(&String::from("a\0b")));
        assert_eq!(encode_key(&b"a\0b"[..]), encode_key(&b"a\0b".to_vec()));
        assert_eq!(encode_key("a\0b"), b"a\x00\xFFb\x00\x01");
    }

    #[test]
    fn malformed_keys_are_errors() {
        assert!(decode_key::<String>(b"abc").is_err());
        assert!(decode_key::<String>(b"a\x00\x02").is_err());
        assert!(decode_key::<String>(b"\xFF\x00\x01").is_err()); // not UTF-8
        assert!(decode_key::<u32>(&[1, 2]).is_err());
        assert!(decode_key::<u8>(&[1, 2]).is_err()); // trailing byte
        assert!(decode_key::<bool>(&[2]).is_err());
    }

    #[test]
    fn prefix_successor_bounds_every_extension() {
        assert_eq!(prefix_successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_successor(b"a\xFF\xFF"), Some(b"b".to_vec()));
        assert_eq!(prefix_successor(b"\xFF"), None);
        let mut rng = Rng(7);
        for _ in 0..500 {
            let prefix = rng.bytes();
            let extended = [prefix.clone(), rng.bytes()].concat();
            if let Some(end) = prefix_successor(&prefix) {
                assert!(extended < end && prefix < end);
            }
        }
    }
}
