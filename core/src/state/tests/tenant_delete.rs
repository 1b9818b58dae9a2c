//! `TenantDelete`: refused while the tenant has functions (unless `force`),
//! its tokens stop at once, its usage and bill stay, late usage still
//! applies, and the name is not handed to a new tenant.

use super::*;

#[test]
fn a_tenant_with_functions_is_deleted_only_with_force() {
    let mut s = region();
    deploy(&mut s, spec("acme", "f", Tier::Guaranteed, 100, 1_000));
    let a = place(&mut s, "acme", "f");
    let e = refused(
        &mut s,
        DomainCommand::TenantDelete {
            tenant: t("acme"),
            force: false,
        },
    );
    assert_eq!(e.code(), "tenant_has_functions");
    assert_eq!(e.class(), ErrorClass::Conflict);
    let r = ok(
        &mut s,
        DomainCommand::TenantDelete {
            tenant: t("acme"),
            force: true,
        },
    );
    assert_eq!(
        r,
        Applied::TenantDeleted {
            tenant: t("acme"),
            functions: vec!["f".into()],
            released: vec![a],
        }
    );
    assert!(s.tenant(&t("acme")).is_none());
    assert!(s.instance(a).is_none());
    assert_eq!(s.functions_of(&t("acme")).count(), 0);
    assert_eq!(s.held(&t("acme"), PoolKind::Center), Quota::default());
    let e = refused(
        &mut s,
        DomainCommand::TenantDelete {
            tenant: t("acme"),
            force: true,
        },
    );
    assert_eq!(e.code(), "unknown_tenant");
    // The other tenant is untouched.
    assert!(s.tenant(&t("globex")).is_some());
}

#[test]
fn a_deleted_tenants_tokens_stop_and_its_bill_stays() {
    let mut s = region();
    let digest = "ab".repeat(32);
    ok(
        &mut s,
        DomainCommand::TokenIssue {
            tenant: t("acme"),
            token_id: "ci".into(),
            digest: digest.clone(),
        },
    );
    register(&mut s, "agent-c1", "c1");
    ok(
        &mut s,
        batch(
            "agent-c1",
            vec![hour_record(1, "acme", Tier::Guaranteed, PoolKind::Center)],
        ),
    );
    let before = whole_day_bill(&s, "acme");
    assert!(before.total > 0);
    ok(
        &mut s,
        DomainCommand::TenantDelete {
            tenant: t("acme"),
            force: false,
        },
    );
    assert!(s.token_owner(&digest).is_none());
    assert_eq!(whole_day_bill(&s, "acme"), before);
    // A record journaled before the delete still applies and is billed.
    ok(
        &mut s,
        batch(
            "agent-c1",
            vec![hour_record(2, "acme", Tier::Guaranteed, PoolKind::Center)],
        ),
    );
    assert!(whole_day_bill(&s, "acme").total > before.total);
    // The name is not given to a new tenant (it would see the old usage).
    let e = refused(
        &mut s,
        DomainCommand::TenantCreate {
            tenant: t("acme"),
            display_name: None,
            quotas: BTreeMap::new(),
        },
    );
    assert_eq!(e.code(), "duplicate_name");
    // A tenant that never existed has no bill, and no usage (not an
    // empty list); the deleted one's usage stays readable.
    assert!(s.bill(&t("nobody"), 0, HOUR_MS).is_err());
    let e = s.usage(&t("nobody"), 0, u64::MAX).unwrap_err();
    assert!(matches!(e, QueryError::NotFound { .. }), "{e:?}");
    assert!(!s.usage(&t("acme"), 0, u64::MAX).unwrap().is_empty());
}
