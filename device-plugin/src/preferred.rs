//! `GetPreferredAllocation`: choose `size` devices from `available`, keeping `must_include`,
//! with the lowest total pairwise link cost (same NUMA node, best interconnect).
//!
//! The kubelet fails pod admission if this call errors, so on valid input it always answers:
//! the result contains `must_include`, is contained in `available` and has exactly `size`
//! elements. Greedy growth from every seed is O(n^2 * size) after an n^2 cost matrix (each
//! candidate's cost to the chosen devices is kept as a running sum), which is microseconds for
//! the 8-16 GPUs of a node and well under a second for the 256 IDs a request may name, and
//! deterministic (ties go to the lowest ID).

/// Why a request cannot be answered.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PreferredError {
    /// Asked for more devices than are available, or a negative number.
    #[error("allocation size {size} is not within 0..={available} available devices")]
    Size {
        /// Requested size.
        size: i64,
        /// Distinct available devices.
        available: usize,
    },
    /// A must-include device is not available.
    #[error("must-include device {0} is not in the available list")]
    NotAvailable(String),
    /// More must-include devices than the allocation size.
    #[error("{must} must-include devices exceed the allocation size {size}")]
    TooManyRequired {
        /// Distinct must-include devices.
        must: usize,
        /// Requested size.
        size: usize,
    },
}

fn dedup_sorted(ids: &[String]) -> Vec<String> {
    let mut v = ids.to_vec();
    v.sort();
    v.dedup();
    v
}

/// Picks the devices; `cost(a, b)` is the link cost between two IDs (lower is better).
pub fn preferred(
    available: &[String],
    must_include: &[String],
    size: i64,
    cost: impl Fn(&str, &str) -> u32,
) -> Result<Vec<String>, PreferredError> {
    let avail = dedup_sorted(available);
    let must = dedup_sorted(must_include);
    let size = usize::try_from(size)
        .ok()
        .filter(|s| *s <= avail.len())
        .ok_or(PreferredError::Size {
            size,
            available: avail.len(),
        })?;
    if let Some(m) = must.iter().find(|m| avail.binary_search(m).is_err()) {
        return Err(PreferredError::NotAvailable(m.clone()));
    }
    if must.len() > size {
        return Err(PreferredError::TooManyRequired {
            must: must.len(),
            size,
        });
    }
    if must.len() == size {
        return Ok(must);
    }
    let n = avail.len();
    let matrix: Vec<u64> = (0..n * n)
        .map(|k| u64::from(cost(&avail[k / n], &avail[k % n])))
        .collect();
    let c = |i: usize, j: usize| matrix[i * n + j];
    let must_idx: Vec<usize> = must
        .iter()
        .filter_map(|m| avail.binary_search(m).ok())
        .collect();

    let grow = |mut chosen: Vec<usize>| -> (u64, Vec<usize>) {
        let mut taken = vec![false; n];
        // to_chosen[i]: the cost from i to every chosen device, kept up to date as devices
        // are added (O(n) a step, where summing afresh for each candidate is O(n * size)).
        let mut to_chosen = vec![0u64; n];
        let add = |j: usize, taken: &mut [bool], to_chosen: &mut [u64]| {
            taken[j] = true;
            for (i, sum) in to_chosen.iter_mut().enumerate() {
                *sum += c(i, j);
            }
        };
        for &j in &chosen {
            add(j, &mut taken, &mut to_chosen);
        }
        while chosen.len() < size {
            let best = (0..n)
                .filter(|&i| !taken[i])
                .min_by_key(|&i| (to_chosen[i], i))
                .expect("size <= n leaves a candidate");
            add(best, &mut taken, &mut to_chosen);
            chosen.push(best);
        }
        let total = chosen
            .iter()
            .enumerate()
            .flat_map(|(k, &i)| chosen[k + 1..].iter().map(move |&j| (i, j)))
            .map(|(i, j)| c(i, j))
            .sum();
        (total, chosen)
    };

    let best = if must_idx.is_empty() {
        (0..n)
            .map(|seed| grow(vec![seed]))
            .min_by_key(|(total, chosen)| {
                let mut ids = chosen.clone();
                ids.sort_unstable();
                (*total, ids)
            })
    } else {
        Some(grow(must_idx))
    };
    let (_, mut chosen) = best.unwrap_or_default();
    chosen.sort_unstable();
    Ok(chosen.into_iter().map(|i| avail[i].clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("d{i}")).collect()
    }

    /// Devices 0-3 on NUMA 0, 4-7 on NUMA 1; 0-1 and 4-5 NVLinked.
    fn numa_cost(a: &str, b: &str) -> u32 {
        let n = |s: &str| s[1..].parse::<u32>().unwrap_or(99);
        let (x, y) = (n(a), n(b));
        if x == y {
            0
        } else if x / 2 == y / 2 {
            5
        } else if x / 4 == y / 4 {
            50
        } else {
            60
        }
    }

    #[test]
    fn prefers_nvlink_pairs_and_one_numa_node() {
        let all = ids(8);
        assert_eq!(
            preferred(&all, &[], 2, numa_cost).unwrap(),
            vec!["d0", "d1"]
        );
        let avail: Vec<String> = ["d1", "d2", "d4", "d5", "d6"].map(String::from).to_vec();
        assert_eq!(
            preferred(&avail, &[], 2, numa_cost).unwrap(),
            vec!["d4", "d5"]
        );
        assert_eq!(
            preferred(&avail, &["d2".into()], 2, numa_cost).unwrap(),
            vec!["d1", "d2"]
        );
        assert_eq!(
            preferred(&all, &[], 4, numa_cost).unwrap(),
            vec!["d0", "d1", "d2", "d3"]
        );
        assert_eq!(
            preferred(&all, &[], 0, numa_cost).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn rejects_only_invalid_input() {
        let all = ids(2);
        assert!(matches!(
            preferred(&all, &[], 3, numa_cost),
            Err(PreferredError::Size { .. })
        ));
        assert!(matches!(
            preferred(&all, &[], -1, numa_cost),
            Err(PreferredError::Size { .. })
        ));
        assert!(matches!(
            preferred(&all, &["x".into()], 1, numa_cost),
            Err(PreferredError::NotAvailable(_))
        ));
        assert!(matches!(
            preferred(&all, &all, 1, numa_cost),
            Err(PreferredError::TooManyRequired { .. })
        ));
    }

    proptest! {
        #[test]
        fn result_is_exact_contains_must_and_is_available(
            n in 1usize..16,
            picks in proptest::collection::vec(any::<bool>(), 16),
            must_picks in proptest::collection::vec(any::<bool>(), 16),
            size_frac in 0.0f64..=1.0,
            dup in any::<bool>(),
        ) {
            let all = ids(16);
            let mut avail: Vec<String> = all.iter().take(n).enumerate().filter(|(i, _)| picks[*i] || *i == 0).map(|(_, s)| s.clone()).collect();
            let must: Vec<String> = avail.iter().enumerate().filter(|(i, _)| must_picks[*i]).map(|(_, s)| s.clone()).collect();
            if dup { avail.extend(avail.clone()); }
            let distinct = dedup_sorted(&avail).len();
            let must_n = dedup_sorted(&must).len();
            let size = must_n + ((distinct - must_n) as f64 * size_frac).floor() as usize;
            let got = preferred(&avail, &must, size as i64, numa_cost).expect("valid input never fails");
            prop_assert_eq!(got.len(), size);
            prop_assert_eq!(dedup_sorted(&got).len(), size, "no duplicates");
            for m in &must { prop_assert!(got.contains(m)); }
            for g in &got { prop_assert!(avail.contains(g)); }
        }
    }
}
