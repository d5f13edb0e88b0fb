//! [bin] `ipybox [FLAGS] SUBCOMMAND ...`: the MCP server's flags given before a subcommand are
//! that subcommand's, or an error naming where they go (issue 50).

use super::Cli;

/// `ipybox [FLAGS] SUBCOMMAND ...`: the flags given before a subcommand (the MCP server's,
/// which `ipybox --help` lists at the top) are moved after it, where the subcommand parses them
/// as its own (`ipybox --sandbox exec -c CODE` is `ipybox exec --sandbox -c CODE`); one the
/// subcommand does not have is an error that says where it goes. None is dropped (issue 50).
/// `--log-level` and `--log-content` apply everywhere and stay. A command line this does not
/// follow (an unknown flag, `--help`) is left to clap as given.
pub(crate) fn flags_before_subcommand(
    args: Vec<std::ffi::OsString>,
) -> Result<Vec<std::ffi::OsString>, String> {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    cli.build();
    let mut global = Vec::new();
    // Each flag given before the subcommand: its long name and its tokens.
    let mut leading: Vec<(String, Vec<std::ffi::OsString>)> = Vec::new();
    let mut at = 1;
    while let Some(token) = args.get(at).and_then(|t| t.to_str()) {
        let Some(long) = token.strip_prefix("--").filter(|l| !l.is_empty()) else {
            let Some(sub) = cli.find_subcommand(token) else {
                return Ok(args);
            };
            if leading.is_empty() || sub.get_name() == "help" {
                return Ok(args);
            }
            let missing: Vec<&str> = leading
                .iter()
                .map(|(name, _)| name.as_str())
                .filter(|name| !sub.get_arguments().any(|a| a.get_long() == Some(*name)))
                .collect();
            if let Some(name) = missing.first() {
                return Err(misplaced(&cli, name, sub.get_name()));
            }
            let mut placed = vec![args[0].clone()];
            placed.extend(global);
            placed.push(args[at].clone());
            placed.extend(leading.into_iter().flat_map(|(_, tokens)| tokens));
            placed.extend(args[at + 1..].iter().cloned());
            return Ok(placed);
        };
        let (name, inline) = match long.split_once('=') {
            Some((name, _)) => (name, true),
            None => (long, false),
        };
        let Some(arg) = cli.get_arguments().find(|a| a.get_long() == Some(name)) else {
            return Ok(args);
        };
        if matches!(
            arg.get_action(),
            clap::ArgAction::Help
                | clap::ArgAction::HelpShort
                | clap::ArgAction::HelpLong
                | clap::ArgAction::Version
        ) {
            return Ok(args);
        }
        let mut tokens = vec![args[at].clone()];
        if !inline && arg.get_action().takes_values() {
            tokens.extend(args.get(at + 1).cloned());
            at += 1;
        }
        at += 1;
        if arg.is_global_set() {
            global.extend(tokens);
        } else {
            leading.push((name.to_string(), tokens));
        }
    }
    Ok(args)
}

/// The error for `--NAME` given before `SUB`, which has no such flag: which commands have it.
fn misplaced(cli: &clap::Command, name: &str, sub: &str) -> String {
    let owners: Vec<&str> = cli
        .get_subcommands()
        .filter(|c| c.get_arguments().any(|a| a.get_long() == Some(name)))
        .map(|c| c.get_name())
        .collect();
    let listed: Vec<String> = owners.iter().map(|c| format!("`ipybox {c}`")).collect();
    let example = owners.first().copied().unwrap_or("serve");
    format!(
        "`--{name}` is given before `{sub}`, which has no such flag (a flag before a subcommand is the subcommand's)\n  help: `--{name}` is a flag of {} and of `ipybox` without a subcommand (the MCP server on stdio): put it after the subcommand it is for, e.g. `ipybox {example} --{name} …`",
        listed.join(", ")
    )
}
