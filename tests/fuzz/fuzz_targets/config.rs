//! The configuration parser: any text as the TOML file `--config` reads
//! (`Config::load` is `toml::from_str` on the file's text), then what
//! `--print-config` prints of it (`Config::to_toml`). Checks:
//! - parsing and validating never panic;
//! - a configuration that was read prints (`to_toml` says it cannot fail
//!   then), and what it prints reads back as a configuration that prints
//!   the same text and is valid exactly when the first was (the printout
//!   leaves out the classification rules, so their verdict is set apart);
//! - a refused setting's message starts with the stable `config_invalid`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use retry_budget::budget::codes;
use retry_budget::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = toml::from_str::<Config>(text) else {
        return;
    };
    let verdict = config.validate();
    if let Err(err) = &verdict {
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("{}: ", codes::CONFIG_INVALID)),
            "{message}"
        );
    }
    let printed = config
        .to_toml()
        .unwrap_or_else(|e| panic!("a configuration that was read prints: {e}\n{text}"));
    let read: Config = toml::from_str(&printed)
        .unwrap_or_else(|e| panic!("--print-config reads back: {e}\n{printed}"));
    assert_eq!(read.to_toml().as_deref(), Ok(printed.as_str()));
    // Without the rules, the same settings are judged the same.
    let mut without_rules = config.clone();
    without_rules.classification.rules.clear();
    assert_eq!(
        without_rules.validate().map_err(|e| e.to_string()),
        read.validate().map_err(|e| e.to_string()),
        "{printed}"
    );
});
