//! The TLS record layer once the handshake is over, sans I/O: [`Cipher`] seals and opens the
//! records of one direction with the traffic key rustls extracted (TLS 1.3, and TLS 1.2's
//! AEAD suites), so the two halves of a connection each own theirs and share no lock on the
//! data path, and a record is sealed straight from the caller's buffer into the outgoing one
//! and opened in place in the incoming one (rustls' buffered API copies each byte three
//! times on the way in, once on the way out).
//!
//! Formats (RFC 8446 §5.2, RFC 5288, RFC 7905), header `type, 3, 3, length (u16 BE)`:
//! - TLS 1.3: outer type 23; body = AEAD(data ‖ inner type ‖ zero padding) ‖ tag; the AAD
//!   is the header; nonce = iv XOR sequence number.
//! - TLS 1.2 AES-GCM: body = explicit nonce (8) ‖ AEAD(data) ‖ tag; nonce = iv[..4] ‖
//!   explicit (we send iv XOR sequence, as rustls does); AAD = seq ‖ type ‖ 3, 3 ‖ data length.
//! - TLS 1.2 ChaCha20-Poly1305: body = AEAD(data) ‖ tag; nonce = iv XOR sequence; the same AAD.

use std::ops::Range;

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::{ConnectionTrafficSecrets, ProtocolVersion};

/// A record header's length.
pub(crate) const HEADER: usize = 5;
/// The AEAD tag's length (every suite rustls offers).
const TAG: usize = 16;
/// TLS 1.2 AES-GCM's explicit nonce.
const EXPLICIT: usize = 8;
/// Most data one record carries (2^14).
pub(crate) const MAX_DATA: usize = 1 << 14;
/// Most a sealed record can add to its data (TLS 1.2 GCM's nonce and tag, or TLS 1.3's type
/// byte and tag): with [`HEADER`], the room to reserve per record.
pub(crate) const OVERHEAD: usize = HEADER + EXPLICIT + TAG;

/// Record content types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Type {
    ChangeCipherSpec = 20,
    Alert = 21,
    Handshake = 22,
    Data = 23,
}

impl Type {
    fn from_u8(b: u8) -> Option<Type> {
        Some(match b {
            20 => Type::ChangeCipherSpec,
            21 => Type::Alert,
            22 => Type::Handshake,
            23 => Type::Data,
            _ => return None,
        })
    }
}

/// A record the layer refuses, with the alert it sends the peer before closing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Length past the protocol's largest record (`record_overflow`).
    Overflow,
    /// The tag does not verify (`bad_record_mac`).
    BadMac,
    /// A body too short to hold a tag, or a type byte nobody defined (`decode_error`).
    Decode,
    /// A record type or message not allowed after the handshake (`unexpected_message`).
    Unexpected,
    /// A field with a value the protocol does not define (`illegal_parameter`).
    Illegal,
    /// The key's sequence numbers are used up (TLS 1.2 cannot rekey): `internal_error`.
    Exhausted,
}

impl Refusal {
    /// The alert description sent for it.
    pub(crate) fn alert(self) -> u8 {
        match self {
            Refusal::Overflow => 22,
            Refusal::BadMac => 20,
            Refusal::Decode => 50,
            Refusal::Unexpected => 10,
            Refusal::Illegal => 47,
            Refusal::Exhausted => 80,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::Overflow => "TLS record longer than the protocol allows",
            Refusal::BadMac => "TLS record failed authentication",
            Refusal::Decode => "malformed TLS record",
            Refusal::Unexpected => "unexpected TLS record or message after the handshake",
            Refusal::Illegal => "TLS message with an illegal value",
            Refusal::Exhausted => "TLS sequence numbers used up",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Tls13,
    Tls12Gcm,
    Tls12Chacha,
}

/// One direction's key, IV and sequence number.
pub(crate) struct Cipher {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
    layout: Layout,
    /// Records one TLS 1.2 key may seal (it cannot be updated): AES-GCM's confidentiality
    /// limit as rustls applies it, 2^24; none for ChaCha20-Poly1305.
    limit: u64,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cipher")
            .field("layout", &self.layout)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Cipher {
    /// The cipher of a direction whose next record has sequence number `seq`; `None` for a
    /// suite this layer does not know (the connection is refused).
    pub(crate) fn new(
        version: ProtocolVersion,
        seq: u64,
        secrets: ConnectionTrafficSecrets,
    ) -> Option<Cipher> {
        let (alg, key, iv, chacha) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv, false),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv, false),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv, true)
            }
            _ => return None,
        };
        let layout = match version {
            ProtocolVersion::TLSv1_3 => Layout::Tls13,
            ProtocolVersion::TLSv1_2 if chacha => Layout::Tls12Chacha,
            ProtocolVersion::TLSv1_2 => Layout::Tls12Gcm,
            _ => return None,
        };
        Some(Cipher {
            key: LessSafeKey::new(UnboundKey::new(alg, key.as_ref()).ok()?),
            iv: iv.as_ref().try_into().ok()?,
            seq,
            layout,
            limit: if layout == Layout::Tls12Gcm {
                1 << 24
            } else {
                u64::MAX
            },
        })
    }

    /// A TLS 1.2 key that has sealed all the records it may.
    pub(crate) fn exhausted(&self) -> bool {
        self.seq >= self.limit
    }

    /// TLS 1.3 (which may update its keys).
    pub(crate) fn is_tls13(&self) -> bool {
        self.layout == Layout::Tls13
    }

    /// Records sealed or opened with this key so far (plus the handshake's, for the first).
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    fn nonce(&self) -> [u8; 12] {
        let mut n = self.iv;
        for (d, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *d ^= s;
        }
        n
    }

    fn aad12(&self, typ: u8, version: [u8; 2], len: usize) -> [u8; 13] {
        let mut a = [0u8; 13];
        a[..8].copy_from_slice(&self.seq.to_be_bytes());
        a[8] = typ;
        a[9..11].copy_from_slice(&version);
        a[11..].copy_from_slice(&(len as u16).to_be_bytes());
        a
    }

    /// The longest body a received record may announce.
    pub(crate) fn max_body(&self) -> usize {
        match self.layout {
            Layout::Tls13 => MAX_DATA + 256,
            _ => MAX_DATA + 2048,
        }
    }

    /// The sealed size (header included) of a record carrying `data` bytes.
    pub(crate) fn sealed_len(&self, data: usize) -> usize {
        HEADER
            + data
            + TAG
            + match self.layout {
                Layout::Tls13 => 1,
                Layout::Tls12Gcm => EXPLICIT,
                Layout::Tls12Chacha => 0,
            }
    }

    /// Seals one record of type `typ` carrying `parts` (at most [`MAX_DATA`] bytes in all)
    /// into the start of `out` (at least [`Cipher::sealed_len`] long); returns its length.
    /// One part is encrypted straight from the caller's buffer; several are gathered first.
    pub(crate) fn seal(
        &mut self,
        typ: Type,
        parts: &[&[u8]],
        out: &mut [u8],
    ) -> Result<usize, Refusal> {
        let data: usize = parts.iter().map(|p| p.len()).sum();
        debug_assert!(data <= MAX_DATA);
        let total = self.sealed_len(data);
        let out = &mut out[..total];
        if self.seq == u64::MAX {
            return Err(Refusal::Exhausted);
        }
        let nonce = self.nonce();
        let body_len = (total - HEADER) as u16;
        let outer = if self.layout == Layout::Tls13 {
            Type::Data
        } else {
            typ
        };
        out[..HEADER].copy_from_slice(&[outer as u8, 3, 3, (body_len >> 8) as u8, body_len as u8]);
        // The AAD: the header (TLS 1.3) or seq, type, version, length (TLS 1.2).
        let mut aad = [0u8; 13];
        let (aad_len, start, extra): (usize, usize, &[u8]) = match self.layout {
            Layout::Tls13 => {
                aad[..HEADER].copy_from_slice(&out[..HEADER]);
                (
                    HEADER,
                    HEADER,
                    std::slice::from_ref(&TYPE_BYTES[typ as usize - 20]),
                )
            }
            Layout::Tls12Gcm => {
                out[HEADER..HEADER + EXPLICIT].copy_from_slice(&nonce[4..]);
                aad = self.aad12(typ as u8, [3, 3], data);
                (13, HEADER + EXPLICIT, &[])
            }
            Layout::Tls12Chacha => {
                aad = self.aad12(typ as u8, [3, 3], data);
                (13, HEADER, &[])
            }
        };
        let aad = Aad::from(&aad[..aad_len]);
        let (ct, rest) = out[start..].split_at_mut(data);
        let n = Nonce::assume_unique_for_key(nonce);
        let sealed = if let [one] = parts {
            self.key
                .seal_out_of_place_scatter(n, aad, one, ct, extra, rest)
        } else {
            let mut at = 0;
            for p in parts {
                ct[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            self.key.seal_in_place_scatter(n, aad, ct, extra, rest)
        };
        sealed.map_err(|_| Refusal::Exhausted)?;
        self.seq += 1;
        Ok(total)
    }

    /// Checks the record `rec` (header and body, as [`record_len`] framed it) before it is
    /// opened: its nonce, AAD and where its ciphertext lies (the tag follows it).
    fn parse(&self, rec: &[u8]) -> Result<Parsed, Refusal> {
        if self.seq == u64::MAX {
            return Err(Refusal::Exhausted);
        }
        let outer = Type::from_u8(rec[0]).ok_or(Refusal::Decode)?;
        let body = rec.len() - HEADER;
        if u16::from_be_bytes([rec[3], rec[4]]) as usize != body {
            return Err(Refusal::Decode);
        }
        let mut nonce = self.nonce();
        let mut aad = [0u8; 13];
        match self.layout {
            Layout::Tls13 => {
                if outer != Type::Data {
                    return Err(Refusal::Unexpected);
                }
                if body < TAG + 1 {
                    return Err(Refusal::Decode);
                }
                if body - TAG > MAX_DATA + 1 {
                    return Err(Refusal::Overflow);
                }
                aad[..HEADER].copy_from_slice(&rec[..HEADER]);
                Ok(Parsed {
                    outer,
                    nonce,
                    aad,
                    aad_len: HEADER,
                    ct: HEADER..rec.len() - TAG,
                })
            }
            Layout::Tls12Gcm | Layout::Tls12Chacha => {
                let explicit = if self.layout == Layout::Tls12Gcm {
                    EXPLICIT
                } else {
                    0
                };
                if body < explicit + TAG {
                    return Err(Refusal::Decode);
                }
                let data = body - explicit - TAG;
                if data > MAX_DATA {
                    return Err(Refusal::Overflow);
                }
                if explicit > 0 {
                    nonce[4..].copy_from_slice(&rec[HEADER..HEADER + EXPLICIT]);
                }
                aad = self.aad12(outer as u8, [rec[1], rec[2]], data);
                Ok(Parsed {
                    outer,
                    nonce,
                    aad,
                    aad_len: 13,
                    ct: HEADER + explicit..rec.len() - TAG,
                })
            }
        }
    }

    /// After a record's plaintext `plain` verified: its type and data length (TLS 1.3:
    /// the inner type is the last byte that is not padding).
    fn finish(&mut self, outer: Type, plain: &[u8]) -> Result<(Type, usize), Refusal> {
        let r = match self.layout {
            Layout::Tls13 => {
                let end = plain
                    .iter()
                    .rposition(|&b| b != 0)
                    .ok_or(Refusal::Unexpected)?;
                let typ = Type::from_u8(plain[end]).ok_or(Refusal::Unexpected)?;
                if end > MAX_DATA {
                    return Err(Refusal::Overflow);
                }
                (typ, end)
            }
            _ => (outer, plain.len()),
        };
        self.seq += 1;
        Ok(r)
    }

    /// Opens, in place, the whole record `rec` (header and body, as [`record_len`] framed
    /// it): its inner type and where its data now lies in `rec`.
    pub(crate) fn open(&mut self, rec: &mut [u8]) -> Result<(Type, Range<usize>), Refusal> {
        let p = self.parse(rec)?;
        self.key
            .open_in_place(
                Nonce::assume_unique_for_key(p.nonce),
                Aad::from(&p.aad[..p.aad_len]),
                &mut rec[p.ct.start..],
            )
            .map_err(|_| Refusal::BadMac)?;
        let (typ, n) = self.finish(p.outer, &rec[p.ct.clone()])?;
        Ok((typ, p.ct.start..p.ct.start + n))
    }

    /// The most room [`Cipher::open_into`] needs for the record `rec` (its ciphertext).
    pub(crate) fn room_for(&self, rec_len: usize) -> usize {
        // A body shorter than a tag is refused by `open_into` before it writes.
        rec_len.saturating_sub(HEADER + TAG)
    }

    /// Opens the whole record `rec` into `out` (at least [`Cipher::room_for`] long),
    /// leaving `rec` as it is: its inner type and how much data now starts `out`.
    pub(crate) fn open_into(
        &mut self,
        rec: &[u8],
        out: &mut [u8],
    ) -> Result<(Type, usize), Refusal> {
        let p = self.parse(rec)?;
        let out = &mut out[..p.ct.len()];
        self.key
            .open_separate_gather(
                Nonce::assume_unique_for_key(p.nonce),
                Aad::from(&p.aad[..p.aad_len]),
                &rec[p.ct.clone()],
                &rec[p.ct.end..],
                out,
            )
            .map_err(|_| Refusal::BadMac)?;
        self.finish(p.outer, out)
    }
}

/// What an alert from the peer means (RFC 8446 §6, RFC 5246 §7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AlertMeaning {
    /// close_notify: the clean end of the stream.
    Close,
    /// A warning that does not end the connection: user_canceled, and in TLS 1.2 any.
    Warning,
    /// Any other alert, with its description: the connection ends.
    Fatal(u8),
}

/// Reads an alert record's data.
pub(crate) fn read_alert(a: &[u8], tls13: bool) -> Result<AlertMeaning, Refusal> {
    match *a {
        [level, _] if level != 1 && level != 2 => Err(Refusal::Illegal),
        [_, 0] => Ok(AlertMeaning::Close),
        [1, 90] => Ok(AlertMeaning::Warning),
        [1, _] if !tls13 => Ok(AlertMeaning::Warning),
        [_, d] => Ok(AlertMeaning::Fatal(d)),
        _ => Err(Refusal::Decode),
    }
}

/// A handshake message after the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PostHandshake<'a> {
    /// A NewSessionTicket's body (for a client to hand to rustls).
    Ticket(&'a [u8]),
    /// A KeyUpdate; `asked`: the peer wants ours too.
    KeyUpdate { asked: bool },
}

/// Splits a handshake record's data (`msg`, opened) into its messages, each whole within
/// the record (one split across records is refused), a KeyUpdate last (a key change ends
/// its record). TLS 1.2 has none (renegotiation is not offered), nor an empty record.
pub(crate) fn post_handshake(
    mut msg: &[u8],
    tls13: bool,
) -> Result<Vec<PostHandshake<'_>>, Refusal> {
    if !tls13 || msg.is_empty() {
        return Err(Refusal::Unexpected);
    }
    let mut out = Vec::new();
    while !msg.is_empty() {
        let [typ, a, b, c, rest @ ..] = msg else {
            return Err(Refusal::Unexpected);
        };
        let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
        if rest.len() < len {
            return Err(Refusal::Unexpected);
        }
        let (body, after) = rest.split_at(len);
        msg = after;
        match *typ {
            4 => out.push(PostHandshake::Ticket(body)),
            24 => {
                if !msg.is_empty() {
                    return Err(Refusal::Unexpected);
                }
                let asked = match body {
                    [0] => false,
                    [1] => true,
                    [_] => return Err(Refusal::Illegal),
                    _ => return Err(Refusal::Decode),
                };
                out.push(PostHandshake::KeyUpdate { asked });
            }
            _ => return Err(Refusal::Unexpected),
        }
    }
    Ok(out)
}

/// The fuzz target `tls_records` (hayate-io's `transport::tls::fuzz_records`): `data`
/// chooses a suite (its first byte), then items `kind, length (u16 LE), bytes`: raw bytes
/// put on the stream as they are (even `kind`), or a record of type `kind / 2 % 4` sealed
/// from them (odd `kind`; in one part or two). The stream is then read as the read half
/// reads it (framed, opened in place or into another buffer by turns, alerts and handshake
/// messages read) until the first refusal: nothing may panic, and no record may give more
/// than 2^14 bytes.
pub(crate) fn fuzz(data: &[u8]) {
    use rustls::crypto::cipher::{AeadKey, Iv};
    let Some((&first, mut input)) = data.split_first() else {
        return;
    };
    let version = if first & 1 == 0 {
        ProtocolVersion::TLSv1_3
    } else {
        ProtocolVersion::TLSv1_2
    };
    let cipher = || {
        let (key, iv) = (AeadKey::from([7u8; 32]), Iv::from([9u8; 12]));
        let s = if first & 2 == 0 {
            ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        } else {
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv }
        };
        Cipher::new(version, 0, s).expect("a known suite")
    };
    let (mut tx, mut rx) = (cipher(), cipher());
    let mut stream = Vec::new();
    while let [kind, lo, hi, rest @ ..] = input {
        let n = (u16::from_le_bytes([*lo, *hi]) as usize).min(rest.len());
        let (bytes, after) = rest.split_at(n);
        input = after;
        if kind & 1 == 0 {
            stream.extend_from_slice(bytes);
            continue;
        }
        let typ = [
            Type::Data,
            Type::Alert,
            Type::Handshake,
            Type::ChangeCipherSpec,
        ][(kind >> 1) as usize % 4];
        let bytes = &bytes[..bytes.len().min(MAX_DATA)];
        let at = stream.len();
        stream.resize(at + tx.sealed_len(bytes.len()), 0);
        let cut = (kind >> 3) as usize % (bytes.len() + 1);
        let (a, b) = bytes.split_at(cut);
        let parts: &[&[u8]] = if a.is_empty() || b.is_empty() {
            &[bytes]
        } else {
            &[a, b]
        };
        tx.seal(typ, parts, &mut stream[at..]).expect("sealed");
    }
    let mut at = 0;
    let mut into = false;
    loop {
        let len = match record_len(&stream[at..], rx.max_body()) {
            Ok(Some(len)) if at + len <= stream.len() => len,
            _ => break,
        };
        let rec = &mut stream[at..at + len];
        let opened = if into {
            let mut out = vec![0u8; rx.room_for(len)];
            rx.open_into(rec, &mut out)
                .map(|(t, n)| (t, out[..n].to_vec()))
        } else {
            rx.open(rec).map(|(t, r)| (t, rec[r].to_vec()))
        };
        into = !into;
        let Ok((typ, data)) = opened else { break };
        assert!(data.len() <= MAX_DATA, "a record gave {} bytes", data.len());
        let ok = match typ {
            Type::Alert => read_alert(&data, rx.is_tls13()).is_ok(),
            Type::Handshake => post_handshake(&data, rx.is_tls13()).is_ok(),
            Type::Data => true,
            Type::ChangeCipherSpec => false,
        };
        if !ok {
            break;
        }
        at += len;
    }
}

/// A record checked by [`Cipher::parse`].
struct Parsed {
    outer: Type,
    nonce: [u8; 12],
    aad: [u8; 13],
    aad_len: usize,
    /// The ciphertext within the record; the tag follows it.
    ct: Range<usize>,
}

/// TLS 1.3's inner type bytes, indexed by type - 20 (a `'static` slice for `extra_in`).
const TYPE_BYTES: [u8; 4] = [20, 21, 22, 23];

/// The length of the record starting `buf` (header included) once its header is there;
/// refuses a length past `max_body` or a type byte nobody defined before its body arrives.
pub(crate) fn record_len(buf: &[u8], max_body: usize) -> Result<Option<usize>, Refusal> {
    if buf.len() < HEADER {
        return Ok(None);
    }
    // Any TLS record version (0x03xx) as rustls' deframer takes; TLS 1.2 authenticates it.
    if Type::from_u8(buf[0]).is_none() || buf[1] != 3 {
        return Err(Refusal::Decode);
    }
    let body = u16::from_be_bytes([buf[3], buf[4]]) as usize;
    if body > max_body {
        return Err(Refusal::Overflow);
    }
    Ok(Some(HEADER + body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    /// AES-256-GCM (`chacha` false) or ChaCha20-Poly1305 keys, the same every call.
    fn cipher(version: ProtocolVersion, chacha: bool) -> Cipher {
        let (key, iv) = (AeadKey::from([7u8; 32]), Iv::from([9u8; 12]));
        let s = if chacha {
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv }
        } else {
            ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        };
        Cipher::new(version, 3, s).unwrap()
    }

    fn kinds() -> Vec<(ProtocolVersion, bool)> {
        let v = [ProtocolVersion::TLSv1_3, ProtocolVersion::TLSv1_2];
        v.iter().flat_map(|&v| [(v, false), (v, true)]).collect()
    }

    fn sealed(tx: &mut Cipher, typ: Type, parts: &[&[u8]]) -> Vec<u8> {
        let mut out = vec![0u8; tx.sealed_len(parts.iter().map(|p| p.len()).sum())];
        let n = tx.seal(typ, parts, &mut out).unwrap();
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn records_round_trip_from_one_part_or_many() {
        for (v, chacha) in kinds() {
            let (mut tx, mut rx) = (cipher(v, chacha), cipher(v, chacha));
            let mut rx2 = cipher(v, chacha);
            let data: Vec<u8> = (0..MAX_DATA as u32).map(|i| (i % 251) as u8).collect();
            for (typ, parts) in [
                (Type::Data, vec![&data[..]]),
                (
                    Type::Data,
                    vec![&data[..10], &data[10..5000], &data[5000..]],
                ),
                (Type::Data, vec![&data[..0]]),
                (Type::Alert, vec![&[1u8, 0][..]]),
                (Type::Handshake, vec![&[24u8, 0, 0, 1][..], &[1u8][..]]),
            ] {
                let mut out = sealed(&mut tx, typ, &parts);
                assert_eq!(record_len(&out, rx.max_body()), Ok(Some(out.len())));
                // Opened into another buffer by a second receiver at the same point.
                let mut into = vec![0u8; rx2.room_for(out.len())];
                let (t2, n) = rx2.open_into(&out, &mut into).unwrap();
                assert_eq!(t2, typ, "{tx:?}");
                assert!(into[..n] == parts.concat()[..], "{tx:?}");
                let (t, r) = rx.open(&mut out).unwrap();
                assert_eq!(t, typ, "{tx:?}");
                assert!(out[r] == parts.concat()[..], "{tx:?}");
            }
        }
    }

    #[test]
    fn a_changed_byte_or_a_replayed_record_is_refused() {
        for (v, chacha) in kinds() {
            let mut tx = cipher(v, chacha);
            let out = sealed(&mut tx, Type::Data, &[&[5u8; 100]]);
            for i in [0, 2, 3, 4, 5, 60, out.len() - 1] {
                let mut bad = out.clone();
                bad[i] ^= 1;
                assert!(cipher(v, chacha).open(&mut bad).is_err(), "{tx:?} byte {i}");
            }
            let mut rx = cipher(v, chacha);
            rx.open(&mut out.clone()).unwrap();
            // The same record again: the receiver's sequence number moved on.
            assert_eq!(rx.open(&mut out.clone()), Err(Refusal::BadMac), "{tx:?}");
        }
    }

    /// Seals `inner` (TLS 1.3 inner plaintext, type byte and padding included) by hand.
    fn seal13(tx: &mut Cipher, inner: &[u8]) -> Vec<u8> {
        let body = (inner.len() + TAG) as u16;
        let header = [23, 3, 3, (body >> 8) as u8, body as u8];
        let mut ct = inner.to_vec();
        let n = Nonce::assume_unique_for_key(tx.nonce());
        let tag = tx
            .key
            .seal_in_place_separate_tag(n, Aad::from(header), &mut ct)
            .unwrap();
        tx.seq += 1;
        [&header[..], &ct, tag.as_ref()].concat()
    }

    #[test]
    fn tls13_padding_is_stripped_and_a_record_with_no_type_refused() {
        let v = ProtocolVersion::TLSv1_3;
        let (mut tx, mut rx) = (cipher(v, false), cipher(v, false));
        let mut rec = seal13(&mut tx, &[&b"hi"[..], &[23u8], &[0u8; 40]].concat());
        let (typ, r) = rx.open(&mut rec).unwrap();
        assert_eq!((typ, &rec[r]), (Type::Data, &b"hi"[..]));
        let mut rec = seal13(&mut tx, &[0u8; 4]);
        assert_eq!(rx.open(&mut rec), Err(Refusal::Unexpected));
        // More than 2^14 + 1 bytes of inner plaintext, padding included: record_overflow.
        let (mut tx, mut rx) = (cipher(v, false), cipher(v, false));
        let inner = [&[7u8; MAX_DATA][..], &[23u8], &[0u8; 200]].concat();
        let mut rec = seal13(&mut tx, &inner);
        assert_eq!(rx.open(&mut rec), Err(Refusal::Overflow));
    }

    #[test]
    fn headers_are_checked_before_the_body_arrives() {
        assert_eq!(record_len(&[23, 3, 3], 100), Ok(None));
        assert_eq!(record_len(&[23, 3, 3, 0, 100], 100), Ok(Some(105)));
        assert_eq!(record_len(&[23, 3, 3, 0, 101], 100), Err(Refusal::Overflow));
        assert_eq!(record_len(b"GET /", 100), Err(Refusal::Decode));
        assert_eq!(record_len(&[23, 0x47, 3, 0, 1], 100), Err(Refusal::Decode));
        let mut rx = cipher(ProtocolVersion::TLSv1_3, false);
        // A TLS 1.3 record whose outer type is not application data; one too short.
        let mut hs = [&[22u8, 3, 3, 0, 20][..], &[0; 20]].concat();
        assert_eq!(rx.open(&mut hs), Err(Refusal::Unexpected));
        let mut short = [&[23u8, 3, 3, 0, 16][..], &[0; 16]].concat();
        assert_eq!(rx.open(&mut short), Err(Refusal::Decode));
    }

    #[test]
    fn alerts_and_post_handshake_messages_are_read_as_the_rfcs_say() {
        use AlertMeaning::*;
        for (a, tls13, want) in [
            (&[1u8, 0][..], true, Ok(Close)),
            (&[2, 0], true, Ok(Close)),
            (&[1, 90], true, Ok(Warning)),
            (&[1, 100], true, Ok(Fatal(100))),
            (&[1, 100], false, Ok(Warning)),
            (&[2, 40], false, Ok(Fatal(40))),
            (&[3, 0], true, Err(Refusal::Illegal)),
            (&[1], true, Err(Refusal::Decode)),
            (&[1, 0, 0], true, Err(Refusal::Decode)),
        ] {
            assert_eq!(read_alert(a, tls13), want, "{a:?} tls13 {tls13}");
        }
        use PostHandshake::*;
        let ticket = [4u8, 0, 0, 3, 7, 8, 9];
        let update = [24u8, 0, 0, 1, 1];
        assert_eq!(
            post_handshake(&[&ticket[..], &ticket, &update].concat(), true),
            Ok(vec![
                Ticket(&[7, 8, 9]),
                Ticket(&[7, 8, 9]),
                KeyUpdate { asked: true }
            ])
        );
        for (m, tls13, want) in [
            (&update[..], false, Refusal::Unexpected),
            (&[][..], true, Refusal::Unexpected),
            (
                &[&update[..], &ticket].concat()[..],
                true,
                Refusal::Unexpected,
            ),
            (&ticket[..6], true, Refusal::Unexpected),
            (&[24, 0, 0, 1, 2][..], true, Refusal::Illegal),
            (&[24, 0, 0, 2, 0, 0][..], true, Refusal::Decode),
            (&[13, 0, 0, 0][..], true, Refusal::Unexpected),
        ] {
            assert_eq!(post_handshake(m, tls13), Err(want), "{m:?}");
        }
    }

    #[test]
    fn the_fuzz_entry_reads_sealed_and_raw_input() {
        // A Data record, an alert, a key update, raw garbage: no panic.
        let mut input = vec![0u8];
        for (kind, bytes) in [
            (1u8, &b"hello"[..]),
            (3, &[1, 90]),
            (5, &[24, 0, 0, 1, 0]),
            (0, &[23, 3, 3, 0, 40]),
        ] {
            input.push(kind);
            input.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
            input.extend_from_slice(bytes);
        }
        for first in 0..4 {
            input[0] = first;
            fuzz(&input);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Any data, cut into any parts, sealed by any suite of either version, opens to
        /// the same type and bytes, in place or into another buffer; any one byte changed
        /// in the record, or any cut, is refused and never panics.
        #[test]
        fn sealed_records_open_whole_and_refuse_any_change(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..MAX_DATA),
            cuts in proptest::collection::vec(0usize..MAX_DATA, 0..5),
            kind in 0usize..4,
            typ in 0usize..3,
            flip in proptest::prelude::any::<(usize, u8)>(),
            cut in proptest::prelude::any::<usize>(),
        ) {
            let (v, chacha) = kinds()[kind];
            let typ = [Type::Data, Type::Alert, Type::Handshake][typ];
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
            at.sort();
            let mut parts = Vec::new();
            let mut prev = 0;
            for c in at.into_iter().chain([data.len()]) {
                parts.push(&data[prev..c]);
                prev = c;
            }
            let mut tx = cipher(v, chacha);
            let rec = sealed(&mut tx, typ, &parts);
            let (t, r) = cipher(v, chacha).open(&mut rec.clone()).unwrap();
            let mut opened = rec.clone();
            cipher(v, chacha).open(&mut opened).unwrap();
            proptest::prop_assert_eq!(t, typ);
            proptest::prop_assert!(opened[r] == data[..]);
            let mut into = vec![0u8; rec.len()];
            let (t, n) = cipher(v, chacha).open_into(&rec, &mut into).unwrap();
            proptest::prop_assert_eq!(t, typ);
            proptest::prop_assert!(into[..n] == data[..]);
            let (i, x) = (flip.0 % rec.len(), flip.1 | 1);
            let mut bad = rec.clone();
            bad[i] ^= x;
            let refused = match record_len(&bad, MAX_DATA + 2048) {
                Ok(Some(len)) if len == bad.len() => cipher(v, chacha).open(&mut bad).is_err(),
                _ => true,
            };
            proptest::prop_assert!(refused, "byte {} changed by {:#x} was accepted", i, x);
            // A record cut short never frames as whole.
            let short = &rec[..cut % rec.len()];
            proptest::prop_assert!(!matches!(record_len(short, MAX_DATA + 2048), Ok(Some(l)) if l <= short.len()));
        }
    }
}
