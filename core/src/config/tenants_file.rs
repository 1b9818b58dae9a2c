//! Reading and validating a tenants file into [`Tenants`] (same two passes
//! as the topology file: shape and types, then meaning).

use super::error::{ConfigError, IssueKind};
use super::names::check_name;
use super::reader::{check_range, parse_document, quote, Field, Issues, TableReader};
use super::tenants::{Tenant, Tenants};
use crate::bounds::MAX_QUOTA;
use crate::model::{PoolKind, Quota, TenantId};
use std::collections::{BTreeMap, HashMap};

/// Largest display name accepted, in characters.
const MAX_DISPLAY_NAME: usize = 200;

struct RawQuota {
    compute_milli: Field<u64>,
    memory_mib: Field<u64>,
    instances: Field<u32>,
}

struct RawTenant {
    name: Field<String>,
    display_name: Field<String>,
    quotas: Vec<(PoolKind, RawQuota)>,
}

/// Parses and validates the tenants file `file` whose text is `src`.
pub fn parse_tenants(file: &str, src: &str) -> Result<Tenants, ConfigError> {
    let mut is = Issues::new(src);
    let Some(doc) = parse_document(src, &mut is) else {
        return Err(is.into_error(file));
    };
    let mut root = TableReader::root(&doc);
    let raw: Vec<RawTenant> = root
        .tables(&mut is, "tenants", true)
        .into_iter()
        .map(|mut t| {
            let name = t.string(&mut is, "name", true);
            let display_name = t.string(&mut is, "display_name", false);
            let mut quotas = Vec::new();
            if let Some(mut q) = t.table(&mut is, "quota", false) {
                for kind in [PoolKind::Center, PoolKind::Edge] {
                    if let Some(mut k) = q.table(&mut is, kind.as_str(), false) {
                        quotas.push((
                            kind,
                            RawQuota {
                                compute_milli: k.uint(&mut is, "compute_milli", true),
                                memory_mib: k.uint(&mut is, "memory_mib", true),
                                instances: k.uint(&mut is, "instances", true),
                            },
                        ));
                        k.finish(&mut is);
                    }
                }
                q.finish(&mut is);
            }
            t.finish(&mut is);
            RawTenant {
                name,
                display_name,
                quotas,
            }
        })
        .collect();
    root.finish(&mut is);

    let mut tenants = Vec::new();
    let mut seen: HashMap<String, String> = HashMap::new();
    for t in raw {
        let name = check_name(&mut is, &t.name);
        if let Some(n) = &name {
            if let Some(first) = seen.get(n) {
                is.report(
                    &t.name.at,
                    IssueKind::Duplicate,
                    format!("duplicate tenant name, first defined at {first}"),
                    Some(quote(n)),
                );
            } else {
                seen.insert(n.clone(), t.name.at.path.clone());
            }
        }
        if let Some(d) = &t.display_name.v {
            let len = d.chars().count();
            if d.trim().is_empty() || len > MAX_DISPLAY_NAME || d.chars().any(char::is_control) {
                is.report(
                    &t.display_name.at,
                    IssueKind::Invalid,
                    format!(
                        "a display name is 1 to {MAX_DISPLAY_NAME} characters, not blank, without control characters"
                    ),
                    Some(quote(d)),
                );
            }
        }
        let mut quotas = BTreeMap::new();
        for (kind, q) in &t.quotas {
            let quota = Quota {
                compute_milli: check_range(&mut is, &q.compute_milli, 0, MAX_QUOTA).unwrap_or(0),
                memory_mib: check_range(&mut is, &q.memory_mib, 0, MAX_QUOTA).unwrap_or(0),
                instances: q.instances.v.unwrap_or(0),
            };
            quotas.insert(*kind, quota);
        }
        tenants.push(Tenant {
            id: TenantId(name.unwrap_or_default()),
            display_name: t.display_name.v,
            quotas,
        });
    }
    if is.is_empty() {
        Ok(Tenants::new(tenants))
    } else {
        Err(is.into_error(file))
    }
}
