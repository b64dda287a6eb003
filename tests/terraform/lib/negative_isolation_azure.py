"""Broken copies of terraform/azure-batch that its isolation tests must reject.

Each case undoes one property that keeps an untrusted run on a pool node from turning the
installation against its operator (terraform/azure-batch/tests/isolation.tftest.hcl asserts each
one) and expects the failed assertion's own message. Loaded by negative.py
(`NEGATIVE_ONLY=azure tests/terraform/negative.sh`).

Root squash on the NFS share has no case: azurerm_storage_share (azurerm 4.55) has no argument for
it, so the module cannot set it (terraform/azure-batch/README.md, "Root squash").
"""

MODULE = "azure-batch"


def cases(Case, TF, TF_TEST):
    def broken(name, file, old, new, message):
        return Case(f"azure-batch isolation: {name}", file, old, new, "test",
                    r"Test assertion failed: " + message, TF_TEST, module=MODULE)

    return [
        Case("azure-batch isolation: clean copy passes", "main.tf", "", "", "", "", TF_TEST,
             append=True, expect_exit=0, module=MODULE),
        # 1. The credentials stay off the share.
        broken("the credentials file back on the NFS share", "main.tf",
               '  credentials_file = "/etc/codalab/worker-credentials"\n',
               '  credentials_file = "${local.shared_work_dir}/.worker-password"\n',
               r"the start task must write the workers' credentials to a node-local file, not "
               r"under the NFS share"),
        broken("a manager without --password-file (it writes the file on the share)", "main.tf",
               '    "--password-file", local.credentials_file,\n', "",
               r"the manager must be given --password-file with the node-local credentials file, "
               r"never a file on the share"),
        broken("a group-readable credentials file", "credentials.sh.tftpl",
               'chmod 600 "$tmp"\n', 'chmod 640 "$tmp"\n',
               r"the credentials file is written with umask 077, mode 600 and an atomic rename"),
        broken("the Key Vault token on curl's command line", "credentials.sh.tftpl",
               "password=$(printf 'Authorization: Bearer %s\\n' \"$token\" |\n"
               "  curl -sSf --retry 5 -H @- ",
               'password=$(curl -sSf --retry 5 -H "Authorization: Bearer $token" ',
               r"the start task must print no secret and put none on a command line"),
        broken("a traced start task (secrets in its log)", "node-start.sh.tftpl",
               "set -euo pipefail\n", "set -euxo pipefail\n",
               r"the start task must print no secret and put none on a command line"),
        broken("the manager VM may mount the share again", "storage.tf",
               "    virtual_network_subnet_ids = [azurerm_subnet.pool.id]\n",
               "    virtual_network_subnet_ids = [azurerm_subnet.pool.id, azurerm_subnet.manager.id]\n",
               r"only the pool's nodes may reach and mount the NFS share: not the manager VM"),
        # 2. Runs cannot reach the metadata service, the WireServer, NFS or the network.
        broken("the metadata service reachable from runs", "main.tf",
               '    "-d 169.254.0.0/16 -j DROP",\n', "",
               r"runs must not reach the instance metadata service 169\.254\.169\.254"),
        broken("the WireServer reachable from runs", "main.tf",
               '    "-d 168.63.129.16 -j DROP",\n', "",
               r"runs must not reach the WireServer 168\.63\.129\.16 but for DNS"),
        broken("the WireServer open before the DNS exceptions", "main.tf",
               '    "-d 168.63.129.16 -p udp --dport 53 -j RETURN",\n'
               '    "-d 168.63.129.16 -p tcp --dport 53 -j RETURN",\n'
               '    "-d 168.63.129.16 -j DROP",\n',
               '    "-d 168.63.129.16 -j RETURN",\n'
               '    "-d 168.63.129.16 -p udp --dport 53 -j RETURN",\n'
               '    "-d 168.63.129.16 -p tcp --dport 53 -j RETURN",\n'
               '    "-d 168.63.129.16 -j DROP",\n',
               r"runs must not reach the WireServer 168\.63\.129\.16 but for DNS"),
        broken("NFS reachable from runs", "main.tf",
               '    "-p tcp --dport 2049 -j DROP",\n', "",
               r"runs must not reach NFS \(TCP and UDP port 2049\) anywhere"),
        broken("the virtual network reachable from runs", "main.tf",
               '    "-d ${var.address_space} -j DROP",\n', "",
               r"runs must not reach the virtual network"),
        broken("the rules on docker0 only (runs are on br-*)", "main.tf",
               '  node_isolation_bridges = ["docker0", "br-+"]\n',
               '  node_isolation_bridges = ["docker0"]\n',
               r"traffic from every Docker bridge \(docker0, br-\*\) must pass the isolation rules"),
        broken("the rules gone after a restart of Docker", "node-start.sh.tftpl",
               "WantedBy=docker.service\n", "WantedBy=multi-user.target\n",
               r"the isolation rules must be applied now and after every start of docker\.service"),
        broken("the share mounted with set-user-id programs", "batch.tf",
               '"-o vers=4,minorversion=1,sec=sys,nosuid,nodev"',
               '"-o vers=4,minorversion=1,sec=sys"',
               r"the nodes mount the share nosuid,nodev"),
        # 4. No public address on the nodes.
        broken("BatchManaged public IPs on the nodes", "batch.tf",
               '    public_address_provisioning_type = "NoPublicIPAddresses"\n',
               '    public_address_provisioning_type = "BatchManaged"\n',
               r"the pool's nodes must get no public IP address"),
        # 1, 5. The pool's identity: the one secret.
        broken("Key Vault Secrets User for the pool on the whole vault", "identity.tf",
               'resource "azurerm_role_assignment" "pool_password" {\n'
               '  scope                = "${azurerm_key_vault.this.id}/secrets/${local.password_secret}"\n',
               'resource "azurerm_role_assignment" "pool_password" {\n'
               '  scope                = azurerm_key_vault.this.id\n',
               r"the pool's identity may read the password secret only \(Key Vault Secrets User on "
               r"that secret, not the vault\)"),
        broken("the pool's subnet kept out of the vault", "keyvault.tf",
               "    virtual_network_subnet_ids = [azurerm_subnet.manager.id, azurerm_subnet.pool.id]\n",
               "    virtual_network_subnet_ids = [azurerm_subnet.manager.id]\n",
               r"the vault denies by default and lets the pool's subnet in"),
    ]
