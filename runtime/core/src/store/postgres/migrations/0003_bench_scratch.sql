-- Version 2: the scratch table of `baton bench`. Its raw primitive, the floor a claim is
-- measured against, is one autocommitted INSERT … ON CONFLICT DO NOTHING into this table; it
-- holds nothing any other operation reads.
CREATE TABLE @schema@.baton_bench_scratch (
    namespace text NOT NULL,
    key text NOT NULL,
    PRIMARY KEY (namespace, key)
);
