-- Whether the charges table has its authorization_id column (a file made before the card
-- network has none: it is added).
SELECT count(*) FROM pragma_table_info('charges') WHERE name = 'authorization_id'
