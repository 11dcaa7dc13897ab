"""Tool calls in every family's own format: what a call is (`calls`), how
values are read as models write them (`values`), where calls are in a reply
(`syntax`, `vendors`), which family a chat template's model belongs to (`families`),
and a reply split into content and checked calls (`split`)."""
