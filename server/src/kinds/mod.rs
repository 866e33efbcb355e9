//! The built-in durable task kinds. Each is a [`TaskKind`](crate::engine::TaskKind) doing real,
//! deterministic work, so that "exactly once" can be checked from its result.

pub mod batch;
pub mod migration;
pub mod processing;
pub mod training;
pub mod trip;

use durable_shared::kinds::{
    BatchProcessing, DataMigration, DataProcessing, MlTraining, TripPlanning,
};

use crate::engine::EngineBuilder;

/// Registers every built-in kind. Registration is all a kind needs besides its module: its
/// tools, CLI flags and dashboard form derive from its `KindSpec`.
pub fn register_all(builder: EngineBuilder) -> EngineBuilder {
    builder
        .register(DataMigration)
        .register(BatchProcessing)
        .register(MlTraining)
        .register(DataProcessing)
        .register(TripPlanning)
}

/// SplitMix64: a tiny, well-known generator whose output is fixed by its definition, so data
/// generated from a seed is identical across runs, platforms and crate upgrades (which is not
/// promised by `rand`'s generators).
pub(crate) fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from a name, stable across runs (FNV-1a).
pub(crate) fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_its_reference_values() {
        // First outputs of SplitMix64 seeded with 0, from the reference implementation.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(0x9E37_79B9_7F4A_7C15), 0x6E78_9E6A_A1B9_65F4);
    }
}
