//! The explanation of a ranking (design §2.2 step 5's queues shown to operators, `/explain`).

use std::fmt::Write as _;

use crate::types::{PredictionSource, RankEntry, Ranking, Review};

fn source_label(s: &PredictionSource) -> String {
    match s {
        PredictionSource::OwnHistory { runs } => format!("own({runs})"),
        PredictionSource::Profile { runs } => format!("profile({runs})"),
        PredictionSource::Transfer => "transfer".to_owned(),
        PredictionSource::Prior => "prior".to_owned(),
    }
}

impl Ranking {
    /// The recommended node, if any.
    pub fn best(&self) -> Option<&RankEntry> {
        self.entries.first()
    }

    /// A plain-text explanation: per node the predicted time with its uncertainty (as a x/÷
    /// factor) and source, the review, good rate, kudos score, default score, merged score and rank;
    /// then the rejected nodes with their reasons.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let class = self.class.as_deref().unwrap_or("-");
        let thr = self
            .threshold_seconds
            .map_or_else(|| "-".to_owned(), |t| format!("{t:.1}s"));
        let _ = writeln!(
            out,
            "pod {}/{} class {class} threshold {thr}",
            self.namespace, self.pod
        );
        let _ = writeln!(
            out,
            "{:>4}  {:<24} {:>12} {:>7} {:<12} {:<6} {:>5} {:>5} {:>7} {:>8}",
            "rank",
            "node",
            "predicted",
            "x/÷",
            "source",
            "review",
            "rate",
            "score",
            "default",
            "merged"
        );
        for e in &self.entries {
            let (pred, unc, src) = match &e.prediction {
                Some(p) => (
                    format!("{:.1}s", p.seconds),
                    format!("{:.2}", p.uncertainty_log_sd.exp()),
                    source_label(&p.source),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let rev = match e.review {
                Some(Review::Good) => "good",
                Some(Review::Bad) => "bad",
                None => "-",
            };
            let _ = writeln!(
                out,
                "{:>4}  {:<24} {:>12} {:>7} {:<12} {:<6} {:>5.2} {:>5} {:>7.0} {:>8.0}",
                e.rank,
                e.node,
                pred,
                unc,
                src,
                rev,
                e.good_rate,
                e.score,
                e.default_score,
                e.merged_score
            );
        }
        for r in &self.rejected {
            let _ = writeln!(out, "  rejected {}: {}", r.node, r.reason);
        }
        out
    }
}
