# The CodaLab password of var.codalab_username. Terraform creates the secret but never its
# value, so the password is in no state file, plan or output. Put it there out of band:
#
#   aws secretsmanager put-secret-value --secret-id <password_secret_arn> \
#     --secret-string file://codalab-password.txt
#
# (or, with Terraform >= 1.11, from an ephemeral variable through `secret_string_wo`; see
# examples/basic).
resource "aws_secretsmanager_secret" "password" {
  #checkov:skip=CKV2_AWS_57:The CodaLab password is changed on the CodaLab server; rotating it here would need a Lambda that logs in to CodaLab, so rotation is manual (put-secret-value).
  name                    = "${var.name}/codalab-password"
  description             = "CodaLab password of ${var.codalab_username}, for cl-worker-manager and its workers"
  kms_key_id              = aws_kms_key.this.arn
  recovery_window_in_days = var.password_secret_recovery_days
  tags                    = local.tags
}
