//! Site isolation with nftables: one table per run (`inet shakedown_<run id>`), two rules per
//! isolated site, each commented with the site's name.
//!
//! Traffic *to* the site's subnet from outside it is dropped by address. Traffic *from* the
//! site's processes is dropped by the socket's group: every etcd of a site runs with the site's
//! own group id, because on loopback a member dials its peers from 127.0.0.1, not from its own
//! address.

use std::net::Ipv4Addr;

use super::disk::{run_cmd, run_cmd_sync};
use super::LocalError;
use crate::command::{run_bounded, COMMAND_BOUND, VERSION_BOUND};

/// The table of a run.
pub fn table_name(run_id: &str) -> String {
    format!("shakedown_{}", run_id.replace(['-', '.'], "_"))
}

/// Whether nftables can be used here (root and the nft binary), with the reason when not.
pub fn available() -> Result<(), crate::targets::Unsupported> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("site isolation needs root (nftables)".into());
    }
    match run_bounded("nft", &["--version"], VERSION_BOUND) {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("site isolation needs nftables: apt-get install nftables".into()),
    }
}

async fn nft(args: &[&str]) -> Result<String, LocalError> {
    run_cmd("nft", args).await
}

/// Drops all traffic to and from `subnet` (a /24), except within it.
pub async fn isolate(table: &str, site: &str, subnet: Ipv4Addr, gid: u32) -> Result<(), LocalError> {
    let net = format!("{subnet}/24");
    let into = format!("ip saddr != {net} ip daddr {net} drop comment \"{site} in\"");
    let from = format!("meta skgid {gid} ip daddr != {net} drop comment \"{site} out\"");
    add_rules(table, [into, from]).await
}

/// Adds `rules` to the run's table (created with its output chain when missing).
async fn add_rules<const N: usize>(table: &str, rules: [String; N]) -> Result<(), LocalError> {
    nft(&["add", "table", "inet", table]).await?;
    nft(&["add", "chain", "inet", table, "out", "{ type filter hook output priority 0 ; policy accept ; }"]).await?;
    for rule in rules {
        let mut args = vec!["add", "rule", "inet", table, "out"];
        args.extend(rule.split(' '));
        nft(&args).await?;
    }
    Ok(())
}

/// Cuts the raft traffic of one member (`name`, at `ip`, its process running with group `gid`)
/// and nothing else: peers' packets to its peer port, its packets from its peer port, and its own
/// packets to any peer port. Its clients still reach it. Rules commented `<name> peer in` /
/// `<name> peer out`.
///
/// The connections already open are reset, not only silenced: a connection whose packets are
/// merely dropped survives a cut of a few seconds, and what the leader wrote to it meanwhile (its
/// pipelined appends, thousands of entries) is delivered when the cut is lifted — seen as a
/// member that caught up through entries after the others had compacted their logs past it.
/// Each packet the rules match is answered with a TCP reset to its sender (its socket closed,
/// its unsent data with it; a new connection is refused), except resets themselves, so that the
/// reset of one side is not stopped by the other side's rule. A packet of the leader's to a
/// connection the member dialed is not matched (it goes to 127.0.0.1): it is delivered until the
/// member's next packet on it (its acknowledgement) resets the member's socket, after which the
/// member's kernel resets the leader's — a segment's worth of entries at most crosses the cut.
pub async fn cut_peer(table: &str, name: &str, ip: Ipv4Addr, gid: u32, peer_port: u16) -> Result<(), LocalError> {
    let reset = "tcp flags & rst == 0 reject with tcp reset";
    add_rules(
        table,
        [
            format!("ip daddr {ip} tcp dport {peer_port} {reset} comment \"{name} peer in\""),
            format!("ip saddr {ip} tcp sport {peer_port} {reset} comment \"{name} peer out\""),
            format!("meta skgid {gid} tcp dport {peer_port} {reset} comment \"{name} peer out\""),
        ],
    )
    .await
}

/// Removes the rules of `cut_peer` for `name`.
pub async fn heal_peer(table: &str, name: &str) -> Result<(), LocalError> {
    let (into, from) = (format!("comment \"{name} peer in\""), format!("comment \"{name} peer out\""));
    delete_rules(table, |l| l.contains(&into) || l.contains(&from)).await
}

/// Removes the rules of `site` (`only_inbound`: the planted bug that forgets the outbound rule).
pub async fn recover(table: &str, site: &str, forget_outbound: bool) -> Result<(), LocalError> {
    let (into, from) = (format!("comment \"{site} in\""), format!("comment \"{site} out\""));
    delete_rules(table, |l| l.contains(&into) || (!forget_outbound && l.contains(&from))).await
}

/// Deletes the rules of the run's output chain whose listed line `matches`.
async fn delete_rules(table: &str, matches: impl Fn(&str) -> bool) -> Result<(), LocalError> {
    let listing = nft(&["-a", "list", "chain", "inet", table, "out"]).await?;
    for line in listing.lines().filter(|l| matches(l)) {
        if let Some(handle) = line.rsplit("# handle ").next().filter(|h| h.trim().chars().all(|c| c.is_ascii_digit())) {
            nft(&["delete", "rule", "inet", table, "out", "handle", handle.trim()]).await?;
        }
    }
    Ok(())
}

/// Sites that have rules in the run's table (from the rules' comments).
pub async fn rules(table: &str) -> Vec<String> {
    let Ok(listing) = nft(&["list", "table", "inet", table]).await else { return vec![] };
    let mut sites: Vec<String> = listing
        .lines()
        .filter_map(|l| l.split("comment \"").nth(1))
        .filter_map(|c| c.split_whitespace().next().map(str::to_string))
        .collect();
    sites.sort();
    sites.dedup();
    sites
}

/// Deletes the run's table if it exists. Returns whether it existed.
pub fn delete_table(table: &str) -> bool {
    let exists = run_bounded("nft", &["list", "table", "inet", table], COMMAND_BOUND).is_ok_and(|o| o.status.success());
    if exists {
        if let Err(e) = run_cmd_sync("nft", &["delete", "table", "inet", table]) {
            tracing::warn!("{e}");
        }
    }
    exists
}
