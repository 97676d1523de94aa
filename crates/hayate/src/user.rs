//! `hayate user`: the `[auth.users.NAME]` tables of the configuration: a password hashed with
//! argon2 (`add`), a bearer token shown once and kept as a digest (`token`).

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use hayate_server::auth::{TOKEN_PREFIX, hash_password, new_token, token_digest};

#[derive(Debug, Args)]
pub(crate) struct UserArgs {
    #[command(subcommand)]
    cmd: UserCmd,
}

#[derive(Debug, Subcommand)]
enum UserCmd {
    /// Hash a password for user NAME and print its `[auth.users.NAME]` table (or append it
    /// to --config FILE). The password is read from standard input (its first line) unless
    /// --password is given.
    Add {
        name: String,
        /// The password (prefer standard input: a flag shows in `ps` and shell history).
        #[arg(long)]
        password: Option<String>,
        /// Groups the user belongs to.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
        /// Append the table to this configuration file (refused if the user is there).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Make a new bearer token for user NAME: prints the token once (give it to the client)
    /// and the `tokens = [...]` line the user's table needs (its SHA-256 digest).
    Token { name: String },
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.@".contains(c))
    {
        bail!("user names are 1 or more of A-Z a-z 0-9 _ - . @ (got {name:?})");
    }
    Ok(())
}

pub(crate) fn run(a: UserArgs) -> Result<()> {
    match a.cmd {
        UserCmd::Add {
            name,
            password,
            groups,
            config,
        } => {
            check_name(&name)?;
            let password = match password {
                Some(p) => p,
                None => {
                    let mut line = String::new();
                    std::io::stdin().lock().read_line(&mut line)?;
                    line.trim_end_matches(['\r', '\n']).to_owned()
                }
            };
            if password.is_empty() {
                bail!("empty password");
            }
            if password.starts_with(TOKEN_PREFIX) {
                bail!("passwords may not start with {TOKEN_PREFIX:?} (that marks a token)");
            }
            let hash = hash_password(&password).map_err(anyhow::Error::msg)?;
            let mut table = format!("\n[auth.users.{name}]\npassword_hash = \"{hash}\"\n");
            if !groups.is_empty() {
                let g: Vec<String> = groups.iter().map(|g| format!("{g:?}")).collect();
                table.push_str(&format!("groups = [{}]\n", g.join(", ")));
            }
            match config {
                None => print!("{}", table.trim_start()),
                Some(path) => {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    let parsed = hayate_server::Config::from_toml(&text).with_context(|| {
                        format!("{} is not a valid configuration", path.display())
                    })?;
                    if parsed.auth.users.contains_key(&name) {
                        bail!(
                            "user {name} is already in {}: remove its table first",
                            path.display()
                        );
                    }
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)?;
                    f.write_all(table.as_bytes())?;
                    println!("added user {name} to {}", path.display());
                }
            }
        }
        UserCmd::Token { name } => {
            check_name(&name)?;
            let t = new_token().map_err(anyhow::Error::msg)?;
            println!("token (shown once; give it to the client): {t}");
            println!("add to [auth.users.{name}]:");
            println!("tokens = [\"{}\"]", token_digest(t.as_bytes()));
        }
    }
    Ok(())
}
