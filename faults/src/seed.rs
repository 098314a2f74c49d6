//! Seeds on the wire. A seed is any `u64`, but TOML integers are signed 64-bit: a seed up to
//! `i64::MAX` is written as an integer, a larger one as a decimal string
//! (`seed = "18000000000000000000"`). Both forms are read back, so every seed the CLI accepts
//! plans, runs, records and replays. Use with `#[serde(with = "shakedown_faults::seed")]`.

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

pub fn serialize<S: Serializer>(seed: &u64, s: S) -> Result<S::Ok, S::Error> {
    match i64::try_from(*seed) {
        Ok(v) => s.serialize_i64(v),
        Err(_) => s.serialize_str(&seed.to_string()),
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(SeedVisitor)
}

struct SeedVisitor;

impl Visitor<'_> for SeedVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a seed: an integer from 0 to 18446744073709551615, or the same as a decimal string")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(format!("seed {v} is negative; seeds are 0 to 18446744073709551615")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        v.parse().map_err(|_| E::custom(format!("seed {v:?} is not an integer from 0 to 18446744073709551615")))
    }
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct S {
        #[serde(with = "super")]
        seed: u64,
    }

    #[test]
    fn small_seeds_are_integers_large_ones_strings_and_both_read_back() {
        assert_eq!(toml::to_string(&S { seed: 7 }).unwrap(), "seed = 7\n");
        assert_eq!(toml::to_string(&S { seed: i64::MAX as u64 }).unwrap(), format!("seed = {}\n", i64::MAX));
        assert_eq!(toml::to_string(&S { seed: u64::MAX }).unwrap(), "seed = \"18446744073709551615\"\n");
        for seed in [0, 7, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX] {
            let s = S { seed };
            assert_eq!(toml::from_str::<S>(&toml::to_string(&s).unwrap()).unwrap(), s);
            assert_eq!(serde_json::from_str::<S>(&serde_json::to_string(&s).unwrap()).unwrap(), s);
        }
        assert!(toml::from_str::<S>("seed = -1").unwrap_err().to_string().contains("negative"));
        assert!(toml::from_str::<S>("seed = \"x\"").unwrap_err().to_string().contains("not an integer"));
    }
}
