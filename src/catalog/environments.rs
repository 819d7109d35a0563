//! The catalog's environments: kept as given (turnlog runs agents in its own process),
//! changed, archived and deleted through an API.

use super::{not_found, Catalog, CatalogFilter, EnvironmentChange, NewEnvironment};
use crate::domain::catalog::Environment;
use crate::domain::event::timestamp_now;
use crate::domain::{Caller, EventBody, RequestKey};
use crate::error::SessionError;
use crate::projection::catalog::{catalog_key, CatalogEnvironments};
use crate::projection::Page;

impl Catalog {
    /// Stores a new environment; a keyed request sent again answers the one its first copy
    /// made (as it is now), as agents do.
    pub async fn create_environment(
        &self,
        caller: &Caller,
        new: NewEnvironment,
        request: Option<&RequestKey>,
    ) -> Result<Environment, SessionError> {
        let id = self.new_id(caller, "env_", request).await?;
        if let (Some(_), Ok(made)) = (request, self.environment(caller, &id).await) {
            return Ok(made);
        }
        let now = timestamp_now();
        let environment = Environment {
            id,
            name: new.name,
            description: new.description,
            config: new.config,
            metadata: new.metadata,
            created_at: now.clone(),
            updated_at: now,
            archived_at: None,
            deleted: false,
            created_by: caller.subject.clone(),
        };
        self.change(|| async {
            Ok((EventBody::CatalogEnvironment { environment: environment.clone() }, environment.clone()))
        })
        .await
    }

    /// Changes an environment: name, description and config replace, metadata is a patch.
    pub async fn update_environment(
        &self,
        caller: &Caller,
        id: &str,
        change: EnvironmentChange,
    ) -> Result<Environment, SessionError> {
        self.change_environment(caller, id, |environment| {
            environment.name = change.name.clone().unwrap_or(environment.name.clone());
            environment.description = change.description.clone().unwrap_or(environment.description.take());
            environment.config = change.config.clone().unwrap_or(environment.config.take());
            if let Some(patch) = &change.metadata {
                crate::domain::metadata::apply_patch(&mut environment.metadata, patch.clone());
            }
        })
        .await
    }

    pub async fn archive_environment(&self, caller: &Caller, id: &str) -> Result<Environment, SessionError> {
        let current = self.environment(caller, id).await?;
        if current.archived_at.is_some() {
            return Ok(current);
        }
        self.change_environment(caller, id, |environment| {
            environment.archived_at.get_or_insert_with(timestamp_now);
        })
        .await
    }

    /// Deletes an environment: it is found no more; sessions made in it go on.
    pub async fn delete_environment(&self, caller: &Caller, id: &str) -> Result<(), SessionError> {
        self.change_environment(caller, id, |environment| environment.deleted = true).await.map(drop)
    }

    async fn change_environment(
        &self,
        caller: &Caller,
        id: &str,
        change: impl Fn(&mut Environment),
    ) -> Result<Environment, SessionError> {
        self.change(|| async {
            let mut environment = self.environment(caller, id).await?;
            change(&mut environment);
            environment.updated_at = timestamp_now();
            Ok((EventBody::CatalogEnvironment { environment: environment.clone() }, environment))
        })
        .await
    }

    /// An environment the caller may see (not deleted).
    pub async fn environment(&self, caller: &Caller, id: &str) -> Result<Environment, SessionError> {
        let key = catalog_key("env_", id).ok_or_else(|| not_found("environment", id))?;
        let found: Option<Environment> = self.projected(CatalogEnvironments::NAME, key).await?;
        let found = found.filter(|e| !e.deleted && caller.may_use(&e.created_by));
        found.ok_or_else(|| not_found("environment", id))
    }

    /// The caller's environments, newest first.
    pub async fn environments(
        &self,
        caller: &Caller,
        filter: &CatalogFilter,
    ) -> Result<Page<Environment>, SessionError> {
        self.list(CatalogEnvironments::NAME, "env_", filter, |e: Environment| {
            let shown = !e.deleted
                && caller.may_use(&e.created_by)
                && (filter.include_archived || e.archived_at.is_none())
                && filter.created.contains(&e.created_at);
            shown.then_some(e)
        })
        .await
    }
}
