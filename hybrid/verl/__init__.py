"""verl's config names as a dialect of ours: `table` (one row per verl name), `translate`
(a command line's overrides to ours, every refusal at once), `resolve` (what needs the
composed config). docs/verl.md is the table as a page."""
