"""Tool calls in every family's own format: what a call is (`calls`), how
values are read as models write them (`values`), where calls are in a reply
(`syntax`, `vendors`, `markup`, `elements`, `recipients`), each family's
syntax, grammar and markers (`families`; which family a template is of is
`localrun.chatformat`'s to say), and a reply split into content and checked
calls (`split`)."""
