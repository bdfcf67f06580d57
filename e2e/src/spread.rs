//! The spread of a figure measured in several rounds: each round's value, their mean, the least
//! and the greatest. Throughput on a shared 2-core machine moves by a tenth from one run to the
//! next, so a ratio from one run says little about a change of a few hundredths; rounds of the
//! modes interleaved on one machine, reported whole, do.

/// One figure over the rounds that measured it.
#[derive(Clone, Debug, PartialEq)]
pub struct Spread {
    /// What was measured (a ratio's name).
    pub name: String,
    /// Each round's value, in round order (rounds that did not give one are left out).
    pub values: Vec<f64>,
    /// Mean of `values`.
    pub mean: f64,
    /// Least of `values`.
    pub min: f64,
    /// Greatest of `values`.
    pub max: f64,
}

/// Each name's spread over `rounds` (each round a list of `(name, value)`), in the order the
/// names first appear; non-finite values are left out, and a name with none is too.
pub fn spreads(rounds: &[Vec<(String, f64)>]) -> Vec<Spread> {
    let mut by_name: Vec<(&str, Vec<f64>)> = Vec::new();
    for &(ref name, v) in rounds.iter().flatten().filter(|(_, v)| v.is_finite()) {
        match by_name.iter_mut().find(|(n, _)| *n == name.as_str()) {
            Some((_, values)) => values.push(v),
            None => by_name.push((name, vec![v])),
        }
    }
    by_name
        .into_iter()
        .map(|(name, values)| Spread {
            name: name.to_owned(),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            values,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(v: &[(&str, f64)]) -> Vec<(String, f64)> {
        v.iter().map(|(n, x)| (n.to_string(), *x)).collect()
    }

    #[test]
    fn each_ratio_keeps_every_round_and_its_range() {
        let rounds = [
            round(&[
                ("kudos/null-extender gpu", 0.86),
                ("kudos/baseline gpu", 0.8),
            ]),
            round(&[("kudos/null-extender gpu", 0.99)]),
            round(&[
                ("kudos/null-extender gpu", 0.88),
                ("kudos/baseline gpu", f64::NAN),
            ]),
        ];
        let s = spreads(&rounds);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "kudos/null-extender gpu");
        assert_eq!(s[0].values, vec![0.86, 0.99, 0.88]);
        assert!((s[0].mean - 0.91).abs() < 1e-12, "{}", s[0].mean);
        assert_eq!((s[0].min, s[0].max), (0.86, 0.99));
        assert_eq!(s[1].values, vec![0.8]);
        assert_eq!((s[1].mean, s[1].min, s[1].max), (0.8, 0.8, 0.8));
        assert!(spreads(&[]).is_empty());
    }
}
