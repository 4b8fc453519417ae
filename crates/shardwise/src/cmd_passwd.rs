//! `shardwise passwd USER`: prints the `[users]` line of a node's config for a user, with the
//! password as a salted SCRAM-SHA-256 verifier (PostgreSQL's format), never the password itself.

use std::io::{BufRead, IsTerminal};

use anyhow::{Context, bail};
use shardwise_server::users::Verifier;

/// Flags of `shardwise passwd`.
#[derive(clap::Args, Debug)]
pub struct PasswdArgs {
    /// The user's name.
    pub user: String,
    /// Read the password from the first line of standard input instead of prompting (also the
    /// default when standard input is not a terminal).
    #[arg(long)]
    pub password_stdin: bool,
}

pub fn run(args: PasswdArgs) -> anyhow::Result<()> {
    if args.user.is_empty() || args.user.contains(':') || args.user.chars().any(char::is_control) {
        bail!("user name {:?}: must be non-empty, without ':' or control characters", args.user);
    }
    let password = if args.password_stdin || !std::io::stdin().is_terminal() {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).context("cannot read the password from standard input")?;
        line.trim_end_matches(['\n', '\r']).to_string()
    } else {
        let first =
            rpassword::prompt_password(format!("password for {}: ", args.user)).context("cannot read the password")?;
        let again = rpassword::prompt_password("again: ").context("cannot read the password")?;
        if first != again {
            bail!("the two passwords differ");
        }
        first
    };
    if password.is_empty() {
        bail!("the password is empty: a configured user needs one");
    }
    let verifier = Verifier::generate(&password);
    eprintln!("# put this line under [users] in every node's --config file:");
    println!("{} = \"{verifier}\"", toml_key(&args.user));
    Ok(())
}

/// The user name as a TOML key: bare when it can be, else a quoted string.
fn toml_key(user: &str) -> String {
    if user.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        user.to_string()
    } else {
        format!("\"{}\"", user.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

#[cfg(test)]
mod tests {
    use super::toml_key;

    #[test]
    fn keys_are_quoted_when_needed() {
        assert_eq!(toml_key("alice"), "alice");
        assert_eq!(toml_key("bob.smith"), "\"bob.smith\"");
        assert_eq!(toml_key("a\"b"), "\"a\\\"b\"");
    }
}
