//! Where a returning player lands (pure).
//!
//! | case | lands in |
//! | --- | --- |
//! | rehydrating login | the zone named by the durable `zone_ref` |
//! | brand-new character | the shard's home zone |
//! | a `zone_ref` this shard does not host | the home zone, with a warning |
//!
//! A reconnect to a copy still held and a handoff's arrival never come here: the runtime
//! resumes the held copy where it stands, and an arrival lands where its handoff was going.

/// Which row of the landing table applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandingCase {
    /// A login rehydrated into its durable zone.
    Rehydrate,
    /// A brand-new character went to the home zone.
    BrandNew,
    /// The durable zone is not hosted here: home zone, with a warning.
    UnhostedZone,
}

/// Chooses the zone for a login from the durable record.
pub fn login_zone(
    zone_ref: Option<&str>,
    brand_new: bool,
    hosts: impl Fn(&str) -> bool,
    home: &str,
) -> (String, LandingCase) {
    match zone_ref.filter(|z| !z.is_empty()) {
        _ if brand_new => (home.to_owned(), LandingCase::BrandNew),
        None => (home.to_owned(), LandingCase::BrandNew),
        Some(zone) if hosts(zone) => (zone.to_owned(), LandingCase::Rehydrate),
        Some(zone) => {
            tracing::warn!(
                event = "zone_not_hosted",
                zone,
                home,
                "landing in the home zone"
            );
            (home.to_owned(), LandingCase::UnhostedZone)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(zone: &str) -> bool {
        matches!(zone, "home" | "darkwood")
    }

    #[test]
    fn each_row_of_the_table() {
        assert_eq!(
            login_zone(Some("darkwood"), false, hosts, "home"),
            ("darkwood".into(), LandingCase::Rehydrate)
        );
        assert_eq!(
            login_zone(None, true, hosts, "home"),
            ("home".into(), LandingCase::BrandNew)
        );
        assert_eq!(
            login_zone(Some("darkwood"), true, hosts, "home"),
            ("home".into(), LandingCase::BrandNew)
        );
        assert_eq!(
            login_zone(Some("elsewhere"), false, hosts, "home"),
            ("home".into(), LandingCase::UnhostedZone)
        );
        assert_eq!(
            login_zone(Some(""), false, hosts, "home"),
            ("home".into(), LandingCase::BrandNew)
        );
    }
}
