//! WebSocket frames, sans-IO (RFC 6455 section 5): the close codes and opcodes, the header
//! of a client frame ([`parse_header`]), the header of a broker frame, control frames, and
//! unmasking.

/// Close codes (RFC 6455 section 7.4.1).
pub(super) mod code {
    pub(in crate::ws) const NORMAL: u16 = 1000;
    pub(in crate::ws) const PROTOCOL: u16 = 1002;
    pub(in crate::ws) const TOO_BIG: u16 = 1009;
}

pub(super) mod op {
    pub(in crate::ws) const CONTINUATION: u8 = 0x0;
    pub(in crate::ws) const TEXT: u8 = 0x1;
    pub(in crate::ws) const BINARY: u8 = 0x2;
    pub(in crate::ws) const CLOSE: u8 = 0x8;
    pub(in crate::ws) const PING: u8 = 0x9;
    pub(in crate::ws) const PONG: u8 = 0xA;
}

/// A frame (header, unmasked) of `len` payload bytes with `opcode`, FIN set.
pub(super) fn frame_header(opcode: u8, len: usize, out: &mut [u8; 10]) -> usize {
    out[0] = 0x80 | opcode;
    if len < 126 {
        out[1] = len as u8;
        2
    } else if len <= u16::MAX as usize {
        out[1] = 126;
        out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        4
    } else {
        out[1] = 127;
        out[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    }
}

/// A whole control frame.
pub(super) fn control_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 10];
    let n = frame_header(opcode, payload.len(), &mut h);
    let mut f = h[..n].to_vec();
    f.extend_from_slice(payload);
    f
}

pub(super) fn close_frame(code: u16) -> Vec<u8> {
    control_frame(op::CLOSE, &code.to_be_bytes())
}

/// XORs `buf` with the masking key, `buf[0]` being payload byte number `offset` (RFC 6455
/// section 5.3), eight bytes at a time.
pub(super) fn unmask(buf: &mut [u8], mask: [u8; 4], offset: usize) {
    let r: [u8; 4] = std::array::from_fn(|i| mask[(offset + i) % 4]);
    let m = u64::from_ne_bytes([r[0], r[1], r[2], r[3], r[0], r[1], r[2], r[3]]);
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        let w = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) ^ m;
        c.copy_from_slice(&w.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= r[i % 4];
    }
}

/// The header of a client frame (RFC 6455 section 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The last frame of its message.
    pub fin: bool,
    /// 0 continuation, 1 text, 2 binary, 8 close, 9 ping, 10 pong.
    pub opcode: u8,
    /// Payload length.
    pub len: u64,
    /// The masking key.
    pub mask: [u8; 4],
    /// Bytes of the header (2 to 14).
    pub header_len: usize,
}

/// Parses the header of a client frame at the front of `raw` (sans-IO): `Ok(None)` when more
/// bytes are needed, `Err` (a reason for close 1002) when the frame is not acceptable from a
/// client: unmasked, reserved bits set, an unknown opcode, a fragmented or longer than 125
/// bytes control frame, a continuation outside a message or a new message inside one
/// (`in_message`: the previous data frame was not final).
pub fn parse_header(raw: &[u8], in_message: bool) -> Result<Option<Header>, &'static str> {
    let [b0, b1, ..] = *raw else {
        return Ok(None);
    };
    let (fin, rsv, opcode) = (b0 & 0x80 != 0, b0 & 0x70, b0 & 0x0F);
    if b1 & 0x80 == 0 {
        return Err("unmasked client frame");
    }
    if rsv != 0 {
        return Err("reserved bits set");
    }
    let len7 = u64::from(b1 & 0x7F);
    let ext = match len7 {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let header_len = 2 + ext + 4;
    if raw.len() < header_len {
        return Ok(None);
    }
    let len = match ext {
        2 => u64::from(u16::from_be_bytes([raw[2], raw[3]])),
        8 => u64::from_be_bytes(raw[2..10].try_into().unwrap_or_default()),
        _ => len7,
    };
    let mask: [u8; 4] = raw[2 + ext..header_len].try_into().unwrap_or_default();
    match opcode {
        op::CLOSE | op::PING | op::PONG if !fin || len > 125 => {
            return Err("fragmented or long control frame");
        }
        op::CLOSE | op::PING | op::PONG => {}
        op::CONTINUATION if !in_message => return Err("continuation without a message"),
        op::TEXT | op::BINARY if in_message => return Err("new message inside a fragmented one"),
        op::CONTINUATION | op::TEXT | op::BINARY => {}
        _ => return Err("unknown opcode"),
    }
    Ok(Some(Header {
        fin,
        opcode,
        len,
        mask,
        header_len,
    }))
}
