// Grants one principal "AcrPull" on one existing container registry (in this module's
// resource group). A module so that the assignment's name is built from the principal id
// (see queue-role.bicep for why).

@description('Name of the existing container registry.')
param registryName string

@description('Principal (object) id that pulls the image.')
param principalId string

// Built-in role "AcrPull".
var acrPullRoleId = '7f951dda-4ed3-4680-a7ca-43fe172d538d'

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' existing = {
  name: registryName
}

resource registryPull 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(registry.id, principalId, acrPullRoleId)
  scope: registry
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', acrPullRoleId)
    principalId: principalId
    principalType: 'ServicePrincipal'
    description: 'sendgate: pull the container image'
  }
}
