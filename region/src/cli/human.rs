//! Human output of the region commands: money in currency units, Unix
//! times as UTC dates, metered quantities in hours. `--json` prints the
//! answers as they came and never goes through here.

/// `units` of a price list's smallest unit as currency, exactly when
/// `per_currency` is a power of ten (`1234567` µUSD → `1.234567 USD`).
pub fn money(units: u64, per_currency: u64, currency: &str) -> String {
    if per_currency == 0 {
        return format!("{units} units");
    }
    let digits = decimal_digits(per_currency);
    match digits {
        Some(0) => format!("{units} {currency}"),
        Some(d) => format!(
            "{}.{:0d$} {currency}",
            units / per_currency,
            units % per_currency
        ),
        None => format!("{:.6} {currency}", units as f64 / per_currency as f64),
    }
}

/// `k` when `n == 10^k`.
fn decimal_digits(n: u64) -> Option<usize> {
    let mut k = 0;
    let mut m = n;
    while m > 1 {
        if m % 10 != 0 {
            return None;
        }
        m /= 10;
        k += 1;
    }
    (m == 1).then_some(k)
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A metering hour (Unix ms ÷ 3,600,000) as `YYYY-MM-DD HH:00 UTC`.
pub fn hour(index: u64) -> String {
    let t = utc(index.saturating_mul(3_600_000));
    // `YYYY-MM-DD HH:MM:SS UTC` → `YYYY-MM-DD HH:MM UTC`.
    format!("{} UTC", &t[..16])
}

/// `value / per` with four decimals (e.g. milli-GPU·ms → GPU-hours).
pub fn ratio(value: u64, per: u64) -> String {
    if per == 0 {
        return value.to_string();
    }
    let scaled = u128::from(value) * 10_000 / u128::from(per);
    format!("{}.{:04}", scaled / 10_000, scaled % 10_000)
}

/// Milli-GPU × milliseconds in one GPU-hour.
pub const MILLI_GPU_MS_PER_GPU_HOUR: u64 = 1_000 * 3_600_000;
/// MiB × milliseconds in one GiB-hour.
pub const MIB_MS_PER_GIB_HOUR: u64 = 1_024 * 3_600_000;

/// Whether an answer's key holds a Unix time in ms (shown as a date).
pub fn is_time_key(key: &str) -> bool {
    key.ends_with("_at") || matches!(key, "effective_from_ms" | "from_ms" | "to_ms" | "now_ms")
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_is_in_currency_units() {
        assert_eq!(money(1_234_567, 1_000_000, "USD"), "1.234567 USD");
        assert_eq!(money(5, 1_000_000, "USD"), "0.000005 USD");
        assert_eq!(money(250, 100, "EUR"), "2.50 EUR");
        assert_eq!(money(7, 1, "JPY"), "7 JPY");
        assert_eq!(money(1, 3, "X"), "0.333333 X");
    }

    #[test]
    fn times_are_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_796_119_124_127), "2026-12-01 09:58:44 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(hour(498_921), "2026-12-01 09:00 UTC");
        assert_eq!(
            ratio(1_000 * 3_600_000, MILLI_GPU_MS_PER_GPU_HOUR),
            "1.0000"
        );
        assert_eq!(ratio(1_800_000, MILLI_GPU_MS_PER_GPU_HOUR), "0.0005");
    }
}
