-- 0008: stock buckets (docs/buckets.md). A sale split over K Redis hash tags keeps the tags'
-- suffixes, comma-separated, as lua.ChooseBucketTags picked them from the slot map when the
-- sale was created: they never change, so every process finds the same buckets. NULL: not split.

-- +goose Up
ALTER TABLE sales ADD COLUMN bucket_tags VARCHAR(1024) NULL;

-- +goose Down
ALTER TABLE sales DROP COLUMN bucket_tags;
