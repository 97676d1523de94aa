//! Payload sizes: the default sweep, parsing "8,64,1KiB,8..64MiB", and human units.

use anyhow::{Context, bail};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
const GIB: usize = 1024 * 1024 * 1024;

/// The default payload sweep: 8 B doubling up to 64 MiB (24 points).
pub fn default_sweep() -> Vec<usize> {
    doubling(8, 64 * MIB)
}

fn doubling(from: usize, to: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut n = from;
    while n <= to {
        v.push(n);
        match n.checked_mul(2) {
            Some(m) => n = m,
            None => break,
        }
    }
    v
}

/// Parses one size: a number with an optional suffix `B`, `K`/`KB`/`KiB`, `M`/`MB`/`MiB`,
/// `G`/`GB`/`GiB` (case-insensitive; all binary: 1 KB = 1 KiB = 1024 B). Fractions are
/// allowed when they give whole bytes ("1.5KiB").
pub fn parse_size(s: &str) -> anyhow::Result<usize> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        bail!("size {s:?}: expected a number");
    }
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        other => bail!("size {s:?}: unknown unit {other:?} (use B, KiB, MiB or GiB)"),
    };
    if let Ok(n) = num.parse::<usize>() {
        return n
            .checked_mul(mult)
            .with_context(|| format!("size {s:?} is too large"));
    }
    let f: f64 = num
        .parse()
        .with_context(|| format!("size {s:?}: bad number {num:?}"))?;
    let bytes = f * mult as f64;
    if bytes.fract() != 0.0 || !bytes.is_finite() || bytes > usize::MAX as f64 {
        bail!("size {s:?} is not a whole number of bytes");
    }
    Ok(bytes as usize)
}

/// Parses a comma-separated list of sizes and doubling ranges: `"8,64,1KiB,64KiB,1MiB"`,
/// `"8..64MiB"` (8, 16, 32, ... up to the last power-of-two multiple not above 64 MiB).
/// The result keeps the given order.
pub fn parse_sizes(s: &str) -> anyhow::Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once("..") {
            let b = b.strip_prefix('=').unwrap_or(b);
            let from = parse_size(a)?;
            let to = parse_size(b)?;
            if from == 0 {
                bail!("range {part:?}: a doubling range cannot start at 0");
            }
            if from > to {
                bail!("range {part:?}: start is above end");
            }
            out.extend(doubling(from, to));
        } else {
            out.push(parse_size(part)?);
        }
    }
    if out.is_empty() {
        bail!("no payload sizes in {s:?}");
    }
    Ok(out)
}

/// "8 B", "1 KiB", "1.5 KiB", "64 MiB".
pub fn format_size(n: usize) -> String {
    let (v, unit) = if n >= GIB {
        (n as f64 / GIB as f64, "GiB")
    } else if n >= MIB {
        (n as f64 / MIB as f64, "MiB")
    } else if n >= KIB {
        (n as f64 / KIB as f64, "KiB")
    } else {
        return format!("{n} B");
    };
    if v.fract() == 0.0 {
        format!("{v:.0} {unit}")
    } else {
        format!("{} {unit}", sig3(v))
    }
}

/// A message rate: "950 msg/s", "12.3k msg/s", "1.23M msg/s".
pub fn format_rate(msgs_per_sec: f64) -> String {
    let (n, p) = si(msgs_per_sec);
    format!("{n}{p} msg/s")
}

/// A bit rate: "640 bit/s", "1.5 Mbit/s", "6.40 Gbit/s".
pub fn format_bits(bits_per_sec: f64) -> String {
    let (n, p) = si(bits_per_sec);
    format!("{n} {p}bit/s")
}

/// Three significant digits and an SI prefix: ("1.23", "M"), ("950", "").
fn si(v: f64) -> (String, &'static str) {
    const PREFIXES: [(f64, &str); 4] = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    for (scale, p) in PREFIXES {
        if v.abs() >= scale {
            return (sig3(v / scale), p);
        }
    }
    (sig3(v), "")
}

fn sig3(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_sizes() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("8B").unwrap(), 8);
        assert_eq!(parse_size("1KiB").unwrap(), 1024);
        assert_eq!(parse_size("64kib").unwrap(), 65536);
        assert_eq!(parse_size("1 MiB").unwrap(), MIB);
        assert_eq!(parse_size("2M").unwrap(), 2 * MIB);
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_size("1GiB").unwrap(), GIB);
        assert!(parse_size("1.3B").is_err());
        assert!(parse_size("KiB").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn parses_lists_and_ranges() {
        assert_eq!(
            parse_sizes("8,64,1KiB,64KiB,1MiB").unwrap(),
            vec![8, 64, 1024, 65536, MIB]
        );
        assert_eq!(parse_sizes("8..64").unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(parse_sizes("10..100").unwrap(), vec![10, 20, 40, 80]);
        assert_eq!(
            parse_sizes("1KiB..=4KiB, 8").unwrap(),
            vec![1024, 2048, 4096, 8]
        );
        assert_eq!(parse_sizes("8..64MiB").unwrap(), default_sweep());
        assert!(parse_sizes("0..8").is_err());
        assert!(parse_sizes("64..8").is_err());
        assert!(parse_sizes(" , ").is_err());
        assert!(parse_sizes("8,x").is_err());
    }

    #[test]
    fn default_sweep_bounds() {
        let s = default_sweep();
        assert_eq!(s.first(), Some(&8));
        assert_eq!(s.last(), Some(&(64 * MIB)));
        assert_eq!(s.len(), 24);
    }

    #[test]
    fn human_units() {
        assert_eq!(format_size(8), "8 B");
        assert_eq!(format_size(1024), "1 KiB");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(64 * MIB), "64 MiB");
        assert_eq!(format_rate(1_234_567.0), "1.23M msg/s");
        assert_eq!(format_rate(950.0), "950 msg/s");
        assert_eq!(format_bits(6.4e9), "6.40 Gbit/s");
    }
}
