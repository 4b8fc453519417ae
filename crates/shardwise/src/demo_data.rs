//! The demo's data set: sales with skewed keys, written as CSV so the demo loads it the way a
//! user would (`shardwise load`).
//!
//! Columns: `order_id` (1..=rows), `customer_id` (Zipf-like over [`CUSTOMERS`]: a few customers
//! place most orders), `product` (`p-000` .. over [`PRODUCTS`], also skewed), `region` (five,
//! skewed), `amount` (0.50 .. 500.00). Deterministic: the same `rows` give the same file.

use std::io::Write;
use std::path::Path;

use anyhow::Context;

/// Distinct customers.
pub const CUSTOMERS: u64 = 100_000;
/// Distinct products.
pub const PRODUCTS: u64 = 500;
/// Regions, most frequent first.
pub const REGIONS: [&str; 5] = ["eu", "us", "apac", "latam", "mea"];

/// The table's columns, for `CREATE TABLE`.
pub const COLUMNS: &str = "order_id BIGINT, customer_id BIGINT, product VARCHAR, region VARCHAR, amount DOUBLE";

/// splitmix64: a well-spread pseudo-random u64 for row `i`, stream `salt`.
fn mix(i: u64, salt: u64) -> u64 {
    let mut z = i.wrapping_add(salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) for row `i`, stream `salt`.
fn unit(i: u64, salt: u64) -> f64 {
    (mix(i, salt) >> 11) as f64 / (1u64 << 53) as f64
}

/// A skewed pick in `0..n`: `n^u - 1` for uniform `u` is log-uniform, so small values are far more
/// frequent (roughly Zipf with exponent 1).
fn skewed(i: u64, salt: u64, n: u64) -> u64 {
    let x = (n as f64).powf(unit(i, salt)) - 1.0;
    (x as u64).min(n - 1)
}

/// Writes `rows` rows of sales, with a header, to `path`.
pub fn write_csv(path: &Path, rows: u64) -> anyhow::Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    writeln!(out, "order_id,customer_id,product,region,amount")?;
    for i in 1..=rows {
        let customer = skewed(i, 1, CUSTOMERS);
        let product = skewed(i, 2, PRODUCTS);
        let region = REGIONS[skewed(i, 3, REGIONS.len() as u64) as usize];
        let cents = 50 + mix(i, 4) % 49_951;
        writeln!(out, "{i},{customer},p-{product:03},{region},{}.{:02}", cents / 100, cents % 100)?;
    }
    out.flush().with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_skewed_and_in_range() {
        let picks: Vec<u64> = (0..100_000).map(|i| skewed(i, 1, CUSTOMERS)).collect();
        assert!(picks.iter().all(|p| *p < CUSTOMERS));
        let small = picks.iter().filter(|p| **p < 100).count();
        // Log-uniform: the first 100 of 100 000 keys take about 40% of the picks.
        assert!(small > 30_000 && small < 50_000, "{small}");
    }

    #[test]
    fn the_file_has_a_header_and_every_row() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sales.csv");
        write_csv(&path, 1000)?;
        let text = std::fs::read_to_string(&path)?;
        assert_eq!(text.lines().count(), 1001);
        assert!(text.starts_with("order_id,customer_id,product,region,amount\n1,"));
        Ok(())
    }
}
