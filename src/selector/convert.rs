//! Conversions from the selector types of `k8s-openapi` and `kube`, so a selector read from a
//! spec (a Deployment's `spec.selector`, a CRD's) selects from a lister with every
//! `matchExpressions` term kept.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as ApiLabelSelector;
use kube::core::Selector;

use super::{LabelSelector, SelectorError};

impl TryFrom<&Selector> for LabelSelector {
    type Error = SelectorError;

    /// Parses kube's rendering of the selector, so both agree on every operator.
    ///
    /// ```
    /// use durable_informer::selector::LabelSelector;
    /// use kube::core::{Expression, Selector};
    ///
    /// let kube_sel = Selector::from_iter([Expression::Equal("app".into(), "web".into())]);
    /// let sel = LabelSelector::try_from(&kube_sel)?;
    /// assert_eq!(sel.to_string(), "app=web");
    /// # Ok::<(), durable_informer::selector::SelectorError>(())
    /// ```
    fn try_from(value: &Selector) -> Result<Self, Self::Error> {
        value.to_string().parse()
    }
}

impl TryFrom<Selector> for LabelSelector {
    type Error = SelectorError;

    fn try_from(value: Selector) -> Result<Self, Self::Error> {
        Self::try_from(&value)
    }
}

impl TryFrom<&ApiLabelSelector> for LabelSelector {
    type Error = SelectorError;

    /// `matchLabels` and `matchExpressions` together (metav1's `LabelSelectorAsSelector`): an
    /// unknown operator, or values where the operator takes none, is an error, never a
    /// requirement dropped. An empty selector matches everything.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use durable_informer::selector::LabelSelector;
    /// use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as Api, LabelSelectorRequirement};
    ///
    /// let spec = Api {
    ///     match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
    ///     match_expressions: Some(vec![LabelSelectorRequirement {
    ///         key: "tier".into(),
    ///         operator: "In".into(),
    ///         values: Some(vec!["front".into(), "back".into()]),
    ///     }]),
    /// };
    /// let sel = LabelSelector::try_from(&spec)?;
    /// assert_eq!(sel.to_string(), "app=web,tier in (back,front)");
    /// # Ok::<(), durable_informer::selector::SelectorError>(())
    /// ```
    fn try_from(value: &ApiLabelSelector) -> Result<Self, Self::Error> {
        for r in value.match_expressions.iter().flatten() {
            let values = r.values.as_ref().map_or(0, Vec::len);
            let ok = match r.operator.as_str() {
                "In" | "NotIn" => values > 0,
                "Exists" | "DoesNotExist" => values == 0,
                _ => {
                    return Err(SelectorError::Syntax(format!(
                        "{:?} is not a valid label selector operator",
                        r.operator
                    )))
                }
            };
            if !ok {
                return Err(SelectorError::Syntax(format!(
                    "values: for 'In', 'NotIn' operators, values set can't be empty; for 'Exists', 'DoesNotExist' it must be empty (key {:?}, operator {})",
                    r.key, r.operator
                )));
            }
        }
        let kube_sel = Selector::try_from(value.clone()).map_err(|e| SelectorError::Syntax(e.0))?;
        Self::try_from(&kube_sel)
    }
}

impl TryFrom<ApiLabelSelector> for LabelSelector {
    type Error = SelectorError;

    fn try_from(value: ApiLabelSelector) -> Result<Self, Self::Error> {
        Self::try_from(&value)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    #[test]
    fn every_operator_of_match_expressions_is_kept() {
        let spec = ApiLabelSelector {
            match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
            match_expressions: Some(vec![
                req("tier", "In", &["a", "b"]),
                req("env", "NotIn", &["dev"]),
                req("owner", "Exists", &[]),
                req("canary", "DoesNotExist", &[]),
            ]),
        };
        let sel = LabelSelector::try_from(&spec).expect("valid");
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        assert!(sel.matches(&labels(&[("app", "web"), ("tier", "a"), ("owner", "x")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "c"), ("owner", "x")])));
        assert!(!sel.matches(&labels(&[
            ("app", "web"),
            ("tier", "a"),
            ("owner", "x"),
            ("env", "dev")
        ])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "a")])));
        assert!(!sel.matches(&labels(&[
            ("app", "web"),
            ("tier", "a"),
            ("owner", "x"),
            ("canary", "1")
        ])));
        assert!(!sel.matches(&labels(&[("app", "db"), ("tier", "a"), ("owner", "x")])));
        assert_eq!(sel.requirements().len(), 5);
    }

    #[test]
    fn an_empty_selector_matches_everything() {
        let sel = LabelSelector::try_from(&ApiLabelSelector::default()).expect("valid");
        assert!(sel.is_empty());
    }

    #[test]
    fn bad_operators_and_values_are_errors() {
        for bad in [
            req("a", "Equals", &["x"]),
            req("a", "In", &[]),
            req("a", "Exists", &["x"]),
            req("a b", "Exists", &[]),
            req("a", "In", &["not valid!"]),
        ] {
            let spec = ApiLabelSelector {
                match_labels: None,
                match_expressions: Some(vec![bad.clone()]),
            };
            assert!(LabelSelector::try_from(&spec).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn kube_selectors_convert_with_their_meaning() {
        use kube::core::Expression;
        let kube_sel = Selector::from_iter([
            Expression::In("tier".into(), ["a".to_owned(), "b".to_owned()].into()),
            Expression::DoesNotExist("canary".into()),
        ]);
        let sel = LabelSelector::try_from(kube_sel).expect("valid");
        assert_eq!(sel.to_string(), "!canary,tier in (a,b)");
    }
}
