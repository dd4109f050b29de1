// Grants one principal "Key Vault Secrets User" (read secret values) on ONE secret of an
// existing vault, not on the whole vault. Deployed into the vault's resource group, which
// may differ from sendgate's. The vault must use the Azure RBAC permission model
// (enableRbacAuthorization: true); with access policies this assignment has no effect and
// the vault owner must add a "get" secret policy for the principal instead.

@description('Name of the existing Key Vault (in this module\'s resource group).')
param keyVaultName string

@description('Name of the secret holding the sendgate API keys file (TOML).')
param secretName string

@description('Principal (object) id of the managed identity that reads the secret.')
param principalId string

// Built-in role "Key Vault Secrets User": read secret contents.
var keyVaultSecretsUserRoleId = '4633458b-17de-408a-b874-0445c86b69e6'

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' existing = {
  name: keyVaultName
}

resource secret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' existing = {
  parent: vault
  name: secretName
}

resource secretsUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(secret.id, principalId, keyVaultSecretsUserRoleId)
  scope: secret
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUserRoleId)
    principalId: principalId
    principalType: 'ServicePrincipal'
    description: 'sendgate: read the API keys file secret'
  }
}
