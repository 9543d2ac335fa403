//! Reading Prometheus/OpenMetrics text, as the tests and the bench read `/metrics`.

/// The sum of the samples of `name` whose labels include every pair of `labels` (all of
/// them when `labels` is empty) in Prometheus/OpenMetrics text; 0 when there is none, as a
/// counter or gauge never touched.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            if !(rest.is_empty() || rest.starts_with('{')) {
                return None;
            }
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_samples_of_one_name_with_the_labels_asked_for() {
        let text = "# TYPE a counter\na_total{x=\"1\"} 2\na_total{x=\"2\"} 3.5\nab_total 7\n";
        assert_eq!(metric_sum(text, "a_total", &[]), 5.5);
        assert_eq!(metric_sum(text, "a_total", &[("x", "2")]), 3.5);
        assert_eq!(metric_sum(text, "ab_total", &[]), 7.0);
        assert_eq!(metric_sum(text, "c", &[]), 0.0);
        assert_eq!(metric_sum(text, "a_total", &[("x", "3")]), 0.0);
    }
}
