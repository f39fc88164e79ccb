SELECT count(*) FROM charges
