//! Statistics of samples: percentile trimming and the median.
//!
//! Percentiles use linear interpolation between closest ranks (numpy's default): with `n`
//! sorted samples, percentile `q` lies at rank `q/100 * (n-1)`. Trimming keeps the samples `x`
//! with `p1 <= x <= p99`; with 10 samples that drops the smallest and the largest (unless
//! they tie with their neighbours).

/// Percentile `q` (0..=100) of `sorted` (ascending), linearly interpolated. `None` if empty.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 100.0) / 100.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// The median of `values` (any order). `None` if empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let v = sorted(values);
    if v.is_empty() {
        return None;
    }
    let n = v.len();
    let m = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(m)
}

/// The samples within the 1st..=99th percentiles, ascending. NaNs are dropped. Fewer than
/// three samples are kept as they are (trimming two samples would drop both).
pub fn trim(values: &[f64]) -> Vec<f64> {
    let v = sorted(values);
    if v.len() < 3 {
        return v;
    }
    let (Some(lo), Some(hi)) = (percentile(&v, 1.0), percentile(&v, 99.0)) else {
        return v;
    };
    v.into_iter().filter(|x| *x >= lo && *x <= hi).collect()
}

/// Trims to the 1st..99th percentiles and returns (median, samples kept).
pub fn summarize(values: &[f64]) -> Option<(f64, usize)> {
    let kept = trim(values);
    median(&kept).map(|m| (m, kept.len()))
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_interpolates() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 50.0), Some(3.0));
        assert_eq!(percentile(&v, 100.0), Some(5.0));
        assert_eq!(percentile(&v, 25.0), Some(2.0));
        assert!((percentile(&v, 1.0).unwrap() - 1.04).abs() < 1e-12);
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
    }

    #[test]
    fn median_odd_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    }

    #[test]
    fn trim_drops_extremes() {
        // 10 samples: the outliers at both ends go, the rest stays.
        let v = [
            100.0, 101.0, 99.0, 1.0, 100.5, 99.5, 1000.0, 100.2, 99.8, 100.1,
        ];
        let kept = trim(&v);
        assert_eq!(kept.len(), 8);
        assert!(!kept.contains(&1.0));
        assert!(!kept.contains(&1000.0));
        assert!(kept.windows(2).all(|w| w[0] <= w[1]));
        let (m, n) = summarize(&v).unwrap();
        assert_eq!(n, 8);
        assert!((m - 100.05).abs() < 1e-9, "{m}");
    }

    #[test]
    fn trim_keeps_ties_and_small_sets() {
        assert_eq!(trim(&[5.0, 5.0, 5.0]), vec![5.0, 5.0, 5.0]);
        assert_eq!(trim(&[2.0]), vec![2.0]);
        assert!(trim(&[]).is_empty());
        // Two samples are not trimmed (p1 and p99 lie strictly between them).
        assert_eq!(trim(&[3.0, 1.0]), vec![1.0, 3.0]);
        assert_eq!(summarize(&[1.0, 3.0]), Some((2.0, 2)));
        assert_eq!(summarize(&[]), None);
        // The median of many samples is robust to one huge outlier.
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        v.push(1e12);
        let (m, n) = summarize(&v).unwrap();
        assert_eq!(n, 99);
        assert_eq!(m, 51.0);
    }
}
