-- Contacts carry a tenant's custom fields: every column of an imported file beyond the known ones, by
-- its header name. Always an object, so a field is found by its key; '{}' for a contact with none.
ALTER TABLE contacts ADD COLUMN attributes jsonb NOT NULL DEFAULT '{}'::jsonb
    CONSTRAINT ck_contacts_attributes_object CHECK (jsonb_typeof(attributes) = 'object');
